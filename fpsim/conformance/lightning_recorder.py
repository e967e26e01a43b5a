"""A Lightning ``Callback`` that writes the scaler trace of a ``Trainer``'s fp16 mixed precision.

Optional dependency, not needed by fpsim nor installed by its CI: Lightning beside an
installed torch, without letting pip pull another torch (``pip install --no-deps
lightning==2.6.6 lightning-utilities torchmetrics``; the PyYAML, fsspec, tqdm and
typing-extensions it also requires are there with fpsim's own dependencies, dask and tqdm).
Checked with Lightning 2.6.6 and torch 2.13.0 on CPU.

On CPU, ``Trainer(precision="16-mixed")`` does not run fp16: Lightning 2.6 warns and
switches to ``"bf16-mixed"``, which has no scaler (``AcceleratorConnector.
_check_and_init_precision``). The fp16 path with torch's ``GradScaler("cpu")`` runs when
the precision plugin is given, ``Trainer(accelerator="cpu", plugins=[MixedPrecision(
"16-mixed", "cpu", scaler)])``; on CUDA ``precision="16-mixed"`` is enough. The callback
refuses a trainer without a scaler.

What it records, per optimizer step of Lightning's ``MixedPrecision.optimizer_step``
(``closure``, ``scaler.unscale_``, ``on_before_optimizer_step``, ``scaler.step``,
``scaler.update``):

- in ``on_before_optimizer_step``: the scale the step used, torch's ``found_inf``
  (``found_inf_of``: what ``scaler.step`` skips on) and the unscaled gradients' statistics;
- whether the optimizer stepped, through a step post-hook;
- in ``on_train_batch_end``: the scale and growth tracker after ``scaler.update``.

A batch whose ``training_step`` returned None is not unscaled or stepped by Lightning, and
leaves no line. One optimizer step per batch (Lightning's automatic optimization); a second
within one batch is refused.

::

    from lightning.pytorch.plugins.precision import MixedPrecision
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=3)
    trainer = Trainer(accelerator="cpu", max_steps=80, callbacks=[ScalerTraceCallback("run.jsonl")],
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    trainer.fit(model, loader)           # then: fpsim check-scaler run.jsonl --preset torch
"""
from __future__ import annotations

try:
    import lightning
    from lightning.pytorch.callbacks import Callback
except ImportError as err:
    raise ImportError("the Lightning recorder needs lightning beside torch: pip install "
                      "--no-deps lightning==2.6.6 lightning-utilities torchmetrics") from err

from .torch_adapter import found_inf_of, grad_stats, open_scaler_trace
from .trace import TraceStep

__all__ = ["ScalerTraceCallback"]


class ScalerTraceCallback(Callback):
    """Write one trace line per scaler update of a Lightning fit (see the module docstring).

    ``target`` is a path or text stream; ``grad_stats=False`` leaves the gradient statistics
    out. The trace is closed at the end of the fit (or on ``close()``)."""

    def __init__(self, target, *, grad_stats: bool = True, source: str | None = None) -> None:
        self._target, self._with_stats, self._source = target, grad_stats, source
        self._writer = None
        self._scaler = None
        self._hooks: list = []
        self._stepped = False
        self._pending: "tuple | None" = None
        self.steps = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None:
            raise ValueError(
                f"ScalerTraceCallback: the trainer's precision plugin "
                f"({type(trainer.precision_plugin).__name__}, precision="
                f"{trainer.precision!r}) has no GradScaler; on CPU Lightning turns "
                f"precision='16-mixed' into 'bf16-mixed': pass plugins=[MixedPrecision("
                f"'16-mixed', 'cpu')] instead")
        self._writer = open_scaler_trace(scaler, self._target, source=self._source,
                                         framework=f"lightning {lightning.__version__}",
                                         attached="callback")
        self._scaler = scaler
        self._hooks = [o.register_step_post_hook(self._on_step) for o in trainer.optimizers]

    def _on_step(self, *_args) -> None:
        self._stepped = True

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        scaler = self._scaler
        if scaler is None:
            return
        state = scaler._per_optimizer_states[id(optimizer)]["stage"]
        if state.name != "UNSCALED":        # Lightning unscales before this hook, or skips
            return
        if self._pending is not None:
            raise ValueError("ScalerTraceCallback records one scaler update per batch; this "
                             "batch stepped a second optimizer (or stepped twice)")
        stats = grad_stats([optimizer]) if self._with_stats else None
        self._pending = (float(scaler.get_scale()), found_inf_of(scaler, [optimizer]), stats)
        self._stepped = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._pending is None:
            return
        scale_before, found, stats = self._pending
        self._pending = None
        scaler = self._scaler
        self._writer.write(TraceStep(
            self.steps, found, scale_before, float(scaler.get_scale()), not self._stepped,
            growth_tracker=int(scaler._get_growth_tracker()), grad_stats=stats))
        self.steps += 1

    def on_fit_end(self, trainer, pl_module) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._writer is not None:
            self._writer.close()
            self._writer = None
