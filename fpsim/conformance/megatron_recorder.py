"""Record the loss scale of Megatron-core's fp16 optimizer in a real training loop, on CPU.

Optional dependency, not needed by fpsim: megatron-core beside an installed torch (``pip
install --no-deps megatron-core==0.16.1``). Checked with megatron-core 0.16.1 and torch
2.13.0 on CPU.

``MegatronOptimizerRecorder`` wraps ``optimizer.step()`` of a ``MixedPrecisionOptimizer``
(``Float16OptimizerWithFloat16Params``, what ``get_megatron_optimizer`` builds for fp16
without the distributed optimizer) and writes one trace line per step: the scale the step's
gradients were scaled with, Megatron's own ``found_inf`` (the flag ``step`` reduced over the
model-parallel group after ``torch._amp_foreach_non_finite_check_and_unscale_``), whether the
inner torch optimizer stepped (a step post-hook), and the ``DynamicGradScaler``'s scale,
growth tracker and hysteresis counter after its ``update``. Replay with preset ``megatron``.

What the CPU run needs, all outside Megatron's code:

- ``single_process_model_parallel()``: a one-process gloo ``torch.distributed`` group over a
  file store (no port to pick) and ``parallel_state.initialize_model_parallel(1, 1)``: the
  step all-reduces ``found_inf`` over the model-parallel group and the gradient clipping
  asks for the tensor-parallel rank;
- ``megatron_on_cpu()``: Megatron's optimizer makes its flags with ``device='cuda'`` and
  accepts only parameters and gradients whose ``Tensor.type()`` is ``'torch.cuda.*Tensor'``
  (its constructor and ``clip_grad_by_total_norm_fp32``). Under this torch function mode a
  ``device='cuda'`` argument becomes ``'cpu'`` and ``Tensor.type()`` answers a CPU tensor's
  type with its CUDA name; the arithmetic is torch's CPU kernels. Build the optimizer and
  its scaler under it; the recorder steps under it when the scaler's scale is on CPU.

::

    single_process_model_parallel()
    model = torch.nn.Linear(4, 2).half()
    with megatron_on_cpu():
        scaler = DynamicGradScaler(initial_scale=2.0 ** 16, min_scale=1.0, growth_factor=2.0,
                                   backoff_factor=0.5, growth_interval=1000, hysteresis=2)
        optimizer = Float16OptimizerWithFloat16Params(
            torch.optim.SGD(model.parameters(), lr=0.01), OptimizerConfig(fp16=True), scaler,
            lambda _: None)
    with MegatronOptimizerRecorder(optimizer, "run.jsonl") as recorder:
        for x, y in data:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            optimizer.scale_loss(loss).backward()
            recorder.step()                 # optimizer.step(), recorded
    # then: fpsim check-scaler run.jsonl --preset megatron
"""
from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack, contextmanager

from .megatron_adapter import cuda_as_cpu
from .step_hook import StepHookRecorder
from .trace import TraceStep, TraceWriter

__all__ = ["MegatronOptimizerRecorder", "megatron_on_cpu", "single_process_model_parallel"]


def _megatron():
    try:
        from megatron.core import parallel_state
        from megatron.core.optimizer.grad_scaler import DynamicGradScaler
    except ImportError as err:
        raise ImportError("the Megatron-core recorder needs megatron-core beside torch: pip "
                          "install --no-deps megatron-core==0.16.1") from err
    return parallel_state, DynamicGradScaler


def single_process_model_parallel() -> None:
    """Start a one-process gloo ``torch.distributed`` group (file store in a temporary
    folder) unless one is running, and Megatron's model parallel state with tensor and
    pipeline parallel size 1 unless it is initialised."""
    import torch.distributed as dist
    parallel_state, _ = _megatron()
    if not dist.is_initialized():
        store = os.path.join(tempfile.mkdtemp(prefix="fpsim-megatron-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _cuda_type_names():
    """A torch function mode under which ``Tensor.type()`` (no argument) of a CPU tensor
    answers ``'torch.cuda.HalfTensor'`` where torch says ``'torch.HalfTensor'``."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaTypeNames(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if (func is torch.Tensor.type and len(args) == 1 and not kwargs
                    and isinstance(result, str) and result.startswith("torch.")
                    and not result.startswith("torch.cuda.")):
                result = "torch.cuda." + result[len("torch."):]
            return result

    return CudaTypeNames()


@contextmanager
def megatron_on_cpu():
    """``cuda_as_cpu()`` and CUDA type names for CPU tensors (see the module docstring)."""
    with ExitStack() as stack:
        stack.enter_context(cuda_as_cpu())
        stack.enter_context(_cuda_type_names())
        yield


def _megatron_version() -> str:
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:  # noqa: BLE001 - a name only, for the trace header
        return "unknown"


class MegatronOptimizerRecorder(StepHookRecorder):
    """Record a Megatron-core ``MixedPrecisionOptimizer``'s loss scale: call
    ``recorder.step()`` where the loop called ``optimizer.step()`` (see the module
    docstring). Attach before the first step: a scaler whose growth tracker or hysteresis
    counter has moved is refused, as is an optimizer without a ``DynamicGradScaler``."""

    def __init__(self, optimizer, target, *, source: str | None = None) -> None:
        _, dynamic_grad_scaler = _megatron()
        scaler = getattr(optimizer, "grad_scaler", None)
        if not isinstance(scaler, dynamic_grad_scaler):
            raise ValueError(f"MegatronOptimizerRecorder needs a MixedPrecisionOptimizer with "
                             f"a DynamicGradScaler; this one has {type(scaler).__name__}")
        if scaler._growth_tracker != 0 or scaler._hysteresis_tracker != scaler.hysteresis:
            raise ValueError("attach the recorder before the optimizer's first step: its "
                             "DynamicGradScaler has already counted steps")
        self.optimizer, self.scaler = optimizer, scaler
        self._on_cpu = scaler.scale.device.type == "cpu"
        device = scaler.scale.device.type
        self._writer = TraceWriter(target, source=source or (
            f"megatron-core {_megatron_version()} {type(optimizer).__name__} "
            f"DynamicGradScaler ({device})"), params={
                "init_scale": float(scaler.scale.item()),
                "min_scale": float(scaler.min_scale.item()),
                "growth_factor": float(scaler.growth_factor.item()),
                "backoff_factor": float(scaler.backoff_factor.item()),
                "growth_interval": int(scaler.growth_interval),
                "hysteresis": int(scaler.hysteresis)})
        self.watch(optimizer.optimizer)

    def step(self):
        """``optimizer.step()`` (under ``megatron_on_cpu()`` on CPU), recorded; returns what
        it returned (``(success, grad_norm, num_zeros_in_grad)``)."""
        scaler = self.scaler
        scale_before = float(scaler.scale.item())
        self.expect_step()
        with megatron_on_cpu() if self._on_cpu else ExitStack():
            result = self.optimizer.step()
        self._writer.write(TraceStep(
            self.steps, float(self.optimizer.found_inf.item()) > 0, scale_before,
            float(scaler.scale.item()), not self.stepped,
            growth_tracker=int(scaler._growth_tracker),
            hysteresis=int(scaler._hysteresis_tracker)))
        self.steps += 1
        return result
