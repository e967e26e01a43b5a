"""Conformance: check a framework's loss scaler and casts against fpsim's reference, step by
step and bit by bit.

- ``trace``: the versioned JSON Lines scaler trace (``read_trace``, ``TraceWriter``).
- ``replay(trace, "torch", **params)``: the first step where a recording and a preset part
  (a ``found_inf=false`` step whose ``grad_stats`` count inf/NaN: a missed overflow).
- ``check_settings(trace.header.params, {"growth_interval": 2000}, preset="torch")``: the
  recorded settings that are not the intended ones.
- ``compare(adapter, found_infs, "torch", **params)``: drive any scaler given as an adapter
  (``update(found_inf) -> scale``, optional ``scale`` and ``state()``) and compare.
- ``patterns`` (NumPy) and ``strategies`` (hypothesis) make overflow patterns.
- ``torch_adapter``, ``jax_adapters``, ``deepspeed_adapters``, ``megatron_adapter``:
  GradScaler, jmp, Keras 3, DeepSpeed (DynamicLossScaler, FP16_Optimizer) and Megatron-core
  (DynamicGradScaler) adapters; ``lightning_recorder`` and ``transformers_recorder``: a
  Lightning ``Callback`` and a Hugging Face ``TrainerCallback`` writing a Trainer's fp16
  scaler trace; ``megatron_recorder`` and ``deepspeed_recorder``: Megatron-core's and
  DeepSpeed's fp16 optimizers' traces from a training loop (optional deps).
- ``check_cast(source, result, "fp16")``: a framework's cast against ``round_to``, by class;
  ``mx_check.check_mx_cast``: an MX cast's E8M0 scale per block, then its elements.
- ``cli``: ``fpsim check-scaler`` and ``fpsim check-cast``.

>>> report = compare(ReferenceAdapter("torch", growth_interval=2), [False, False, True], "torch",
...                  growth_interval=2)
>>> print(report)
agree: 3 of 3 steps match preset torch (growth_interval=2) (compared: scale_before, scale_after,
skipped, growth_tracker, hysteresis)
"""
from .adapters import AdapterError, ReferenceAdapter, ScalerAdapter, compare, record
from .expect import check_settings
from .patterns import (bursts, clean_runs, collapse, growth_to_limit, random_flags,
                       standard_patterns, steps_to_collapse, steps_to_limit)
from .replay import COMPARED_FIELDS, Divergence, Report, replay
from .trace import (TRACE_FORMAT, TRACE_VERSION, Trace, TraceFormatError, TraceHeader,
                    TraceStep, TraceWriter, read_trace, write_trace)

__all__ = [
    "Trace", "TraceHeader", "TraceStep", "TraceWriter", "TraceFormatError", "read_trace",
    "write_trace", "TRACE_FORMAT", "TRACE_VERSION",
    "replay", "Report", "Divergence", "COMPARED_FIELDS", "check_settings",
    "ScalerAdapter", "ReferenceAdapter", "AdapterError", "record", "compare",
    "random_flags", "bursts", "clean_runs", "collapse", "growth_to_limit",
    "steps_to_collapse", "steps_to_limit", "standard_patterns",
]
