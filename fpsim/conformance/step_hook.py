"""What the recorders that wrap a framework's fp16 optimizer share (DeepSpeed's
``FP16_Optimizer``, Megatron-core's ``Float16OptimizerWithFloat16Params``): a post-step hook
on the inner torch optimizer that notes whether the step ran (a skipped step never reaches
it), a step counter, and closing, which removes the hook and closes the trace, also as a
context manager."""
from __future__ import annotations

__all__ = ["StepHookRecorder"]


class StepHookRecorder:
    """Base of the optimizer-wrapping recorders: they set ``self._writer`` (their
    ``TraceWriter``) and call ``watch(inner)`` once in ``__init__``; ``stepped`` says whether
    the inner optimizer stepped since ``expect_step()``."""

    _writer = None

    def watch(self, inner_optimizer) -> None:
        self.stepped = False
        self.steps = 0
        self._hook = inner_optimizer.register_step_post_hook(self._on_step)

    def expect_step(self) -> None:
        self.stepped = False

    def _on_step(self, *_args) -> None:
        self.stepped = True

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
