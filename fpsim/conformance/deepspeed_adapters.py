"""DeepSpeed's loss scalers behind the adapter protocol, run on CPU.

Optional dependency, not needed by fpsim: DeepSpeed beside an installed torch, without
letting pip pull another torch (``pip install --no-deps deepspeed==0.19.6 hjson einops
py-cpuinfo && pip install pydantic``; ``.ci/run`` does this). Checked against DeepSpeed 0.19.6.

``DynamicLossScalerAdapter``
    ``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler``, the scaler of the ZeRO
    optimizers: ``update(found_inf)`` calls its ``update_scale(found_inf)``. Reports the
    hysteresis counter (``cur_hysteresis``) and the growth tracker in fpsim's convention,
    derived from DeepSpeed's iteration counters (see ``growth_tracker_of``). Preset
    ``deepspeed``.
``FP16OptimizerAdapter``
    The non-ZeRO ``deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer`` around a
    one-element fp16 parameter and ``torch.optim.SGD(lr=0)``: every ``update(found_inf)``
    gives the parameter a gradient of ``inf`` (overflow) or ``1.0`` and calls the real
    ``step()``, so the overflow is found by DeepSpeed's own ``CheckOverflow.has_overflow``
    and the scale moved by its own ``_update_scale``; whether the inner optimizer stepped is
    seen through a step post-hook. Preset ``deepspeed-fp16``.

Both need ``deepspeed.comm`` initialised (the scaler asks for its rank when it logs an
overflow; the optimizer all-reduces the overflow flag): ``single_process_group()`` starts a
one-process gloo group, its rendezvous a file store in a temporary folder (no port to pick),
once per process.

Not run as a doctest: the first time a process starts DeepSpeed, it logs to standard output
which accelerator it found (the DeepSpeed conformance tests run this comparison).

>>> from fpsim.conformance import compare                              # doctest: +SKIP
>>> compare(DynamicLossScalerAdapter(scale_window=3), [False] * 7 + [True],  # doctest: +SKIP
...         "deepspeed").agree
True
"""
from __future__ import annotations

import os
import sys
import tempfile

__all__ = ["DynamicLossScalerAdapter", "FP16OptimizerAdapter", "single_process_group",
           "deepspeed_version", "growth_tracker_of"]


def _deepspeed():
    try:
        import deepspeed
    except ImportError as err:
        raise ImportError("the DeepSpeed adapters need deepspeed beside torch: pip install "
                          "--no-deps deepspeed==0.19.6 hjson einops py-cpuinfo && pip "
                          "install pydantic") from err
    return deepspeed


def deepspeed_version() -> str:
    return f"deepspeed {_deepspeed().__version__}"


def single_process_group() -> None:
    """Initialise ``deepspeed.comm`` as a gloo group of one process over a file store, unless
    it already is. DeepSpeed's CPU backend would first JIT-compile its shared-memory
    all-reduce op (minutes of C++ on two cores) that a group of one never uses; that build
    is skipped for this call."""
    _deepspeed()
    from deepspeed import comm as dist
    if dist.is_initialized():
        return
    backend_module = sys.modules["deepspeed.comm.torch"]   # the package's `torch` is torch
    build = backend_module.build_shm_op
    backend_module.build_shm_op = lambda: None
    store = os.path.join(tempfile.mkdtemp(prefix="fpsim-deepspeed-"), "store")
    try:
        dist.init_distributed(dist_backend="gloo", init_method=f"file://{store}", rank=0,
                              world_size=1, auto_mpi_discovery=False, verbose=False)
    finally:
        backend_module.build_shm_op = build


def growth_tracker_of(cur_iter: int, last_overflow_iter: int, scale_window: int) -> int:
    """fpsim's growth tracker from DeepSpeed's counters, read after an update.

    DeepSpeed grows when ``stable = cur_iter - last_overflow_iter - 1`` (taken before
    ``cur_iter += 1``) is a positive multiple of the window; after the update that value is
    ``cur_iter - last_overflow_iter - 2``: -1 right after an overflow (fpsim's
    ``tracker_start=-1``), else ``stable % scale_window`` (0 after a growth)."""
    stable = cur_iter - last_overflow_iter - 2
    return -1 if stable < 0 else stable % scale_window


class DynamicLossScalerAdapter:
    """A real DeepSpeed ``DynamicLossScaler`` (see the module docstring). Keyword arguments
    are its own, with the DeepSpeed fp16 config's defaults."""

    def __init__(self, scaler=None, *, init_scale: float = 2.0 ** 16, scale_window: int = 1000,
                 min_scale: float = 1.0, delayed_shift: int = 2,
                 consecutive_hysteresis: bool = False,
                 raise_error_at_min_scale: bool = True) -> None:
        deepspeed = _deepspeed()
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
        single_process_group()
        if scaler is None:
            scaler = DynamicLossScaler(
                init_scale=init_scale, scale_window=scale_window, min_scale=min_scale,
                delayed_shift=delayed_shift, consecutive_hysteresis=consecutive_hysteresis,
                raise_error_at_min_scale=raise_error_at_min_scale)
        self.scaler = scaler
        self.name = f"deepspeed {deepspeed.__version__} DynamicLossScaler"
        self.params = {
            "init_scale": float(scaler.cur_scale), "growth_factor": scaler.scale_factor,
            "backoff_factor": scaler.scale_factor, "growth_interval": scaler.scale_window,
            "min_scale": float(scaler.min_scale), "hysteresis": scaler.delayed_shift,
            "hysteresis_refill": "clean" if scaler.consecutive_hysteresis else "growth",
            "raise_at_min": bool(scaler.raise_error_at_min_scale)}

    @property
    def scale(self) -> float:
        return float(self.scaler.cur_scale)

    def update(self, found_inf: bool) -> float:
        self.scaler.update_scale(bool(found_inf))
        return float(self.scaler.cur_scale)

    def state(self) -> dict:
        s = self.scaler
        return {"growth_tracker": growth_tracker_of(s.cur_iter, s.last_overflow_iter,
                                                    s.scale_window),
                "hysteresis": s.cur_hysteresis}


class FP16OptimizerAdapter:
    """A real DeepSpeed non-ZeRO ``FP16_Optimizer`` (see the module docstring).
    ``init_scale``, ``scale_window`` and ``min_scale`` are its ``dynamic_loss_args``."""

    def __init__(self, *, init_scale: float = 2.0 ** 16, scale_window: int = 1000,
                 min_scale: float = 1.0) -> None:
        deepspeed = _deepspeed()
        import torch
        from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
        single_process_group()
        self._torch = torch
        self._param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float16))
        inner = torch.optim.SGD([self._param], lr=0.0)
        self.optimizer = FP16_Optimizer(
            inner, dynamic_loss_scale=True, verbose=False,
            dynamic_loss_args={"init_scale": init_scale, "scale_window": scale_window,
                               "min_scale": min_scale})
        # registered after FP16_Optimizer's constructor, whose own warm-up step() ran
        inner.register_step_post_hook(self._on_step)
        self._stepped = self._skipped = False
        self._grads = {True: torch.full((1,), float("inf"), dtype=torch.float16),
                       False: torch.ones(1, dtype=torch.float16)}
        config = self.optimizer.loss_scale_config
        self.name = f"deepspeed {deepspeed.__version__} FP16_Optimizer"
        self.params = {
            "init_scale": float(config.cur_scale), "growth_factor": config.scale_factor,
            "backoff_factor": config.scale_factor, "growth_interval": config.scale_window,
            "min_scale": float(config.min_loss_scale)}

    def _on_step(self, *_args) -> None:
        self._stepped = True

    @property
    def scale(self) -> float:
        return float(self.optimizer.loss_scale_config.cur_scale)

    def update(self, found_inf: bool) -> float:
        self._param.grad = self._grads[bool(found_inf)].clone()
        self._stepped = False
        self.optimizer.step()
        self._skipped = not self._stepped
        return self.scale

    def state(self) -> dict:
        c = self.optimizer.loss_scale_config
        return {"growth_tracker": growth_tracker_of(c.cur_iter, c.last_overflow_iter,
                                                    c.scale_window),
                "skipped": self._skipped}
