"""Record the loss scale of DeepSpeed's fp16 optimizer in a real training loop.

Optional dependency, not needed by fpsim: DeepSpeed beside an installed torch (``pip install
--no-deps deepspeed==0.19.6 hjson einops py-cpuinfo && pip install pydantic``). Checked with
DeepSpeed 0.19.6 and torch 2.13.0 on CPU.

``FP16OptimizerRecorder`` wraps the step of DeepSpeed's non-ZeRO fp16 optimizer,
``FP16_Optimizer`` (or ``FP16_UnfusedOptimizer``), and writes one trace line per step: the
scale the step's gradients were scaled with, DeepSpeed's own overflow flag
(``optimizer.overflow``, from ``CheckOverflow.has_overflow`` on the fp16 gradients), whether
the inner torch optimizer stepped (a step post-hook), the scale and growth tracker after
``_update_scale``, and ``grad_stats`` (``count``, ``nonfinite``) of the fp16 gradients the
overflow check read. Replay with preset ``deepspeed-fp16``.

DeepSpeed's engine refuses fp16 on CPU, so on CPU the optimizer is built directly (after
``single_process_group()``, which the optimizer's overflow all-reduce needs); on a GPU the
recorder takes the engine (``deepspeed.initialize`` with ``"fp16": {"enabled": true}`` and
no ZeRO) and steps it::

    single_process_group()
    model = torch.nn.Linear(4, 2).half()
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                               dynamic_loss_scale=True, verbose=False,
                               dynamic_loss_args={"init_scale": 2.0 ** 16, "scale_window": 1000,
                                                  "min_scale": 1.0})
    with FP16OptimizerRecorder(optimizer, "ds.jsonl") as recorder:
        for x, y in data:
            optimizer.zero_grad()
            optimizer.backward(loss_fn(model(x), y))     # the loss times the scale
            recorder.step()                              # optimizer.step(), recorded
    # then: fpsim check-scaler ds.jsonl --preset deepspeed-fp16
"""
from __future__ import annotations

from .deepspeed_adapters import deepspeed_version, growth_tracker_of, single_process_group
from .step_hook import StepHookRecorder
from .trace import TraceStep, TraceWriter

__all__ = ["FP16OptimizerRecorder", "single_process_group"]


def _fp16_optimizer_types() -> tuple:
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    return FP16_Optimizer, FP16_UnfusedOptimizer


class FP16OptimizerRecorder(StepHookRecorder):
    """Record DeepSpeed's fp16 optimizer: call ``recorder.step()`` where the loop called
    ``optimizer.step()`` (or ``engine.step()``); see the module docstring. ``target`` is a
    path or text stream. Attach before the first step: an optimizer whose scaler has counted
    iterations is refused, as are a static loss scale and a ZeRO optimizer."""

    def __init__(self, optimizer_or_engine, target, *, source: str | None = None) -> None:
        version = deepspeed_version()
        engine = None
        if hasattr(optimizer_or_engine, "is_gradient_accumulation_boundary"):
            engine, optimizer = optimizer_or_engine, optimizer_or_engine.optimizer
        else:
            optimizer = optimizer_or_engine
        if not isinstance(optimizer, _fp16_optimizer_types()):
            raise ValueError(f"FP16OptimizerRecorder records DeepSpeed's non-ZeRO fp16 "
                             f"optimizers (FP16_Optimizer, FP16_UnfusedOptimizer); got "
                             f"{type(optimizer).__name__}")
        config = optimizer.loss_scale_config
        if not config.dynamic_loss_scale:
            raise ValueError("FP16OptimizerRecorder needs a dynamic loss scale; this optimizer "
                             "has a static one")
        if config.cur_iter != 0:
            raise ValueError("attach the recorder before the optimizer's first step: its "
                             f"loss scaler has counted {config.cur_iter} iterations")
        self.engine, self.optimizer, self.config = engine, optimizer, config
        self._writer = TraceWriter(target, source=source or (
            f"{version} {type(optimizer).__name__}"
            + (" (DeepSpeedEngine)" if engine is not None else "")), params={
                "init_scale": float(config.cur_scale),
                "growth_factor": float(config.scale_factor),
                "backoff_factor": float(config.scale_factor),
                "growth_interval": int(config.scale_window),
                "min_scale": float(config.min_loss_scale)})
        self.watch(optimizer.optimizer)

    def _grad_stats(self) -> dict:
        count = nonfinite = 0
        for group in self.optimizer.fp16_groups:
            for param in group:
                if param.grad is not None:
                    count += param.grad.numel()
                    nonfinite += int((~param.grad.isfinite()).sum().item())
        return {"count": count, "nonfinite": nonfinite}

    def step(self):
        """The optimizer's (or engine's) step, recorded; returns what it returned. An engine
        step off a gradient-accumulation boundary updates nothing and records nothing."""
        if self.engine is not None and not self.engine.is_gradient_accumulation_boundary():
            return self.engine.step()
        config = self.config
        scale_before, stats = float(config.cur_scale), self._grad_stats()
        self.expect_step()
        result = (self.engine or self.optimizer).step()
        self._writer.write(TraceStep(
            self.steps, bool(self.optimizer.overflow), scale_before, float(config.cur_scale),
            not self.stepped,
            growth_tracker=growth_tracker_of(config.cur_iter, config.last_overflow_iter,
                                             config.scale_window), grad_stats=stats))
        self.steps += 1
        return result
