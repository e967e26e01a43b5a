"""Megatron-core's ``DynamicGradScaler`` behind the adapter protocol, run on CPU.

Optional dependency, not needed by fpsim: megatron-core beside an installed torch, without
letting pip pull another torch (``pip install --no-deps megatron-core==0.16.1``; its declared
requirements are torch, numpy and packaging; ``.ci/run`` does this). Checked against
megatron-core 0.16.1.

``DynamicGradScalerAdapter``
    ``megatron.core.optimizer.grad_scaler.DynamicGradScaler``: ``update(found_inf)`` calls
    its ``update(found_inf)``, as Megatron's ``MixedPrecisionOptimizer.step`` does with the
    flag it reduced from ``torch._amp_foreach_non_finite_check_and_unscale_``. Reports its
    ``_growth_tracker`` (fpsim's convention already) and ``_hysteresis_tracker``. Megatron's
    optimizer skips exactly the overflowing steps, so no skip is reported. Preset
    ``megatron``.

The scaler makes its scale, minimum and factors with ``torch.tensor(..., device='cuda')``.
On a machine without CUDA the adapter builds it under ``cuda_as_cpu()``, a torch function
mode that turns a ``device='cuda'`` argument into ``'cpu'`` for the constructor's calls only:
Megatron's own code runs unchanged, on float32 CPU tensors (the same float32 arithmetic).

>>> from fpsim.conformance import compare
>>> compare(DynamicGradScalerAdapter(growth_interval=3), [False] * 7 + [True], "megatron").agree
True
"""
from __future__ import annotations

__all__ = ["DynamicGradScalerAdapter", "cuda_as_cpu"]


def _grad_scaler_module():
    try:
        from megatron.core.optimizer import grad_scaler
    except ImportError as err:
        raise ImportError("the Megatron-core adapter needs megatron-core beside torch: pip "
                          "install --no-deps megatron-core==0.16.1") from err
    return grad_scaler


def cuda_as_cpu():
    """A ``torch.overrides.TorchFunctionMode`` under which torch calls given
    ``device='cuda'`` (or ``'cuda:N'``) get ``device='cpu'`` instead."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaAsCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda":
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    return CudaAsCpu()


def _megatron_version() -> str:
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:  # noqa: BLE001 - a name only; the scaler itself is what is checked
        return "unknown"


class DynamicGradScalerAdapter:
    """A real Megatron-core ``DynamicGradScaler`` (see the module docstring). Keyword
    arguments are its own, with the defaults of Megatron's ``OptimizerConfig``
    (``initial_loss_scale=2**32``, ``min_loss_scale=1``, ``loss_scale_window=1000``,
    ``hysteresis=2``) and of ``get_megatron_optimizer`` (factors 2.0 and 0.5)."""

    def __init__(self, scaler=None, *, initial_scale: float = 2.0 ** 32,
                 min_scale: float = 1.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000,
                 hysteresis: int = 2) -> None:
        import torch
        grad_scaler = _grad_scaler_module()
        if scaler is None:
            make = lambda: grad_scaler.DynamicGradScaler(  # noqa: E731
                initial_scale=initial_scale, min_scale=min_scale, growth_factor=growth_factor,
                backoff_factor=backoff_factor, growth_interval=growth_interval,
                hysteresis=hysteresis)
            if torch.cuda.is_available():
                scaler = make()
            else:
                with cuda_as_cpu():
                    scaler = make()
        self.scaler = scaler
        self.name = (f"megatron-core {_megatron_version()} DynamicGradScaler "
                     f"({scaler.scale.device.type})")
        self.params = {
            "init_scale": float(scaler.scale.item()),
            "min_scale": float(scaler.min_scale.item()),
            "growth_factor": float(scaler.growth_factor.item()),
            "backoff_factor": float(scaler.backoff_factor.item()),
            "growth_interval": int(scaler.growth_interval),
            "hysteresis": int(scaler.hysteresis)}

    @property
    def scale(self) -> float:
        return float(self.scaler.scale.item())

    def update(self, found_inf: bool) -> float:
        self.scaler.update(bool(found_inf))
        return float(self.scaler.scale.item())

    def state(self) -> dict:
        return {"growth_tracker": self.scaler._growth_tracker,
                "hysteresis": self.scaler._hysteresis_tracker}
