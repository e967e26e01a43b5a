"""A Hugging Face ``TrainerCallback`` that writes the scaler trace of ``Trainer(fp16=True)``.

Optional dependency, not needed by fpsim nor installed by its CI: transformers and accelerate
beside an installed torch, without letting pip pull another torch (``pip install --no-deps
transformers==5.23.0 accelerate==1.15.0 tokenizers==0.23.3 safetensors==0.8.0
huggingface-hub==2.4.0 && pip install httpx2 regex``; PyYAML, tqdm, packaging and psutil
come with fpsim's other dependencies). Checked with transformers 5.23.0, accelerate 1.15.0
and torch 2.13.0 on CPU.

``Trainer(fp16=True)`` scales through accelerate: on a CUDA device ``Accelerator`` makes a
``torch.amp.GradScaler("cuda")``; on CPU it makes none and does not autocast (fp16 is then
silently fp32). ``use_cpu_grad_scaler(trainer, scaler)`` sets the two ``Accelerator``
attributes (``scaler``, ``native_amp``) that the CUDA path sets, before ``train()`` prepares
the model and optimizer, so the CPU run autocasts to float16 and steps through the given
``GradScaler("cpu")``. The callback refuses a trainer without a scaler.

What it records, per optimizer step of ``Trainer._inner_training_loop`` (backward through
``scaler.scale``, ``clip_grad_norm_`` which unscales, ``on_pre_optimizer_step``,
``optimizer.step()`` which is accelerate's ``scaler.step`` + ``scaler.update``,
``on_optimizer_step``):

- in ``on_pre_optimizer_step``: the scale the step used, torch's ``found_inf``
  (``found_inf_of``, what ``scaler.step`` acts on) and the unscaled gradients' statistics;
- whether the update was skipped: for an ordinary optimizer, whether its ``step`` ran (a step
  post-hook); for one that takes the scaler's ``found_inf`` itself
  (``_step_supports_amp_scaling``: the fused Adam/AdamW/Adagrad that ``optim=
  "adamw_torch_fused"``, the Trainer's default with torch >= 2.8, builds) ``step`` always
  runs and the kernel skips inside, winding each parameter's ``state["step"]`` back: skipped
  when no step counter advanced. A fused optimizer without step counters (fused SGD) is
  refused. (accelerate's own ``optimizer_step_was_skipped`` asks only whether ``step`` ran:
  with the fused AdamW it is False on every overflow, and the Trainer advances its learning
  rate schedule on those skipped steps; the test shows it with accelerate 1.15.0);
- in ``on_optimizer_step``: the scale and growth tracker after ``scaler.update``.

::

    trainer = Trainer(model=model, args=TrainingArguments(..., fp16=True), train_dataset=data,
                      callbacks=[ScalerTraceCallback("run.jsonl")])
    use_cpu_grad_scaler(trainer, torch.amp.GradScaler("cpu"))      # on CPU only
    trainer.train()                     # then: fpsim check-scaler run.jsonl --preset torch
"""
from __future__ import annotations

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as err:
    raise ImportError("the transformers recorder needs transformers and accelerate beside "
                      "torch: pip install --no-deps transformers==5.23.0 accelerate==1.15.0 "
                      "tokenizers==0.23.3 safetensors==0.8.0 huggingface-hub==2.4.0 && pip "
                      "install httpx2 regex") from err

import torch

from .torch_adapter import found_inf_of, grad_stats, open_scaler_trace
from .trace import TraceStep

__all__ = ["ScalerTraceCallback", "use_cpu_grad_scaler"]


def use_cpu_grad_scaler(trainer, scaler=None):
    """Give a CPU ``Trainer(fp16=True)`` the GradScaler and float16 autocast that accelerate
    gives it on CUDA (see the module docstring); call before ``trainer.train()``. Returns
    the scaler (a new ``GradScaler("cpu")`` when none is given)."""
    accelerator = trainer.accelerator
    if not trainer.args.fp16 or accelerator.mixed_precision != "fp16":
        raise ValueError("use_cpu_grad_scaler: the trainer is not fp16 (TrainingArguments("
                         "fp16=True))")
    if accelerator.device.type != "cpu" or accelerator.scaler is not None:
        raise ValueError(f"use_cpu_grad_scaler is for a CPU trainer without a scaler; this one "
                         f"runs on {accelerator.device.type!r} with "
                         f"{type(accelerator.scaler).__name__}")
    if getattr(trainer, "optimizer", None) is not None and hasattr(trainer.optimizer, "scaler"):
        raise ValueError("use_cpu_grad_scaler must run before trainer.train() prepares the "
                         "optimizer")
    accelerator.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu")
    accelerator.native_amp = True      # what makes prepare() wrap forward in fp16 autocast
    return accelerator.scaler


def _step_counters(optimizer) -> float:
    """The sum of the optimizer's per-parameter ``state["step"]`` counters (0 before any)."""
    return sum(float(state["step"]) for state in optimizer.state.values() if "step" in state)


class ScalerTraceCallback(TrainerCallback):
    """Write one trace line per scaler update of a ``Trainer`` run (see the module docstring).

    ``target`` is a path or text stream; ``grad_stats=False`` leaves the gradient statistics
    out. The trace is closed at the end of training (or on ``close()``)."""

    def __init__(self, target, *, grad_stats: bool = True, source: str | None = None) -> None:
        self._target, self._with_stats, self._source = target, grad_stats, source
        self._writer = None
        self._scaler = None
        self._hook = None
        self._fused = False
        self._stepped = False
        self._pending: "tuple | None" = None
        self.steps = 0

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        scaler = getattr(optimizer, "scaler", None)      # accelerate's AcceleratedOptimizer
        if scaler is None:
            raise ValueError(
                "ScalerTraceCallback: the Trainer steps without a GradScaler (fp16="
                f"{args.fp16}); Trainer(fp16=True) has one on a CUDA device, on CPU call "
                "use_cpu_grad_scaler(trainer) before train()")
        inner = optimizer.optimizer
        self._fused = bool(getattr(inner, "_step_supports_amp_scaling", False))
        if self._fused and not _keeps_step_counters(inner):
            raise ValueError(f"ScalerTraceCallback: {type(inner).__name__} applies the "
                             f"scaler's found_inf inside its fused step and keeps no step "
                             f"counter to show whether it skipped; use its unfused form")
        self._writer = open_scaler_trace(scaler, self._target, source=self._source,
                                         framework=f"transformers {transformers.__version__}",
                                         attached="callback")
        self._scaler = scaler
        self._hook = inner.register_step_post_hook(self._on_step)

    def _on_step(self, *_args) -> None:
        self._stepped = True

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs) -> None:
        scaler = self._scaler
        if scaler is None:
            return
        inner = optimizer.optimizer
        stage = scaler._per_optimizer_states[id(inner)]["stage"]
        if stage.name != "UNSCALED":   # the Trainer's gradient norm unscales before this hook
            raise ValueError(f"ScalerTraceCallback: the gradients are not unscaled before the "
                             f"optimizer step (GradScaler stage {stage.name}); torch's "
                             f"found_inf is not known yet")
        if self._pending is not None:
            raise ValueError("ScalerTraceCallback records one scaler update per optimizer "
                             "step; the previous step left no on_optimizer_step")
        stats = grad_stats([inner]) if self._with_stats else None
        self._pending = (float(scaler.get_scale()), found_inf_of(scaler, [inner]), stats,
                         _step_counters(inner))
        self._stepped = False

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs) -> None:
        if self._pending is None:
            return
        scale_before, found, stats, counters_before = self._pending
        self._pending = None
        if self._fused:       # step always ran; the fused kernel winds its counters back
            skipped = _step_counters(optimizer.optimizer) == counters_before
        else:
            skipped = not self._stepped
        scaler = self._scaler
        self._writer.write(TraceStep(
            self.steps, found, scale_before, float(scaler.get_scale()), skipped,
            growth_tracker=int(scaler._get_growth_tracker()), grad_stats=stats))
        self.steps += 1

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.close()

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _keeps_step_counters(optimizer) -> bool:
    """Whether the optimizer is one of torch's whose fused step keeps a per-parameter
    ``state["step"]`` and winds it back by ``found_inf`` (Adam, AdamW, Adagrad; SGD keeps
    none). Known by class: before the first step the state is still empty."""
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad))
