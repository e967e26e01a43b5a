"""PyTorch's ``torch.amp.GradScaler`` behind the adapter protocol, a recorder for real
training runs, and a bit-for-bit check of its unscale numerics.

Needs torch (optional: ``pip install torch==2.13.0``; on CPU ``torch.amp.GradScaler("cpu")``).

``GradScalerAdapter``
    Drives a real GradScaler through its public step: every ``update(found_inf)`` scales a
    loss, gives a one-element parameter a gradient (``inf`` for an overflow, ``1.0`` else),
    calls ``scaler.step(optimizer)`` and ``scaler.update()``. ``found_inf`` is therefore
    decided by torch's own kernel, and whether the optimizer step ran is seen through a
    step post-hook (``Optimizer.register_step_post_hook``), not assumed.
``GradScalerRecorder``
    Wraps ``scaler.step(optimizer); scaler.update()`` in a training loop and writes one trace
    line per step: the scale before and after, torch's ``found_inf`` (read from
    ``GradScaler._found_inf_per_device``, the value ``step`` itself acts on), whether the
    optimizer step ran, the growth tracker, and statistics of the unscaled gradients.
``check_unscale``
    ``GradScaler.unscale_`` on given float32 gradients and scale against
    ``fpsim.scaling.unscale``: ``inv_scale`` and every unscaled gradient bit for bit, and
    ``found_inf``. torch's ``inv_scale`` is observed, not recomputed: a gradient of exactly
    1.0 is appended, and its unscaled value is ``1.0 * inv_scale``.

GradScaler's tracker is fpsim's ``growth_tracker`` (both count clean steps from 0).

Supported torch versions (``check_supported`` refuses others, in one line): the recorders
read private members of ``GradScaler`` -- ``_scale``, ``_get_growth_tracker()`` (the int
count of consecutive clean steps), ``_found_inf_per_device(optimizer)`` (a dict of device ->
float32 tensor, non-zero where ``unscale_`` found an inf/NaN) and, in the Lightning and
transformers callbacks, ``_per_optimizer_states[id(optimizer)]["stage"]`` -- which have that
meaning in the earliest ``torch/cuda/amp/grad_scaler.py`` read (a 2020 copy, from before the
``OptState`` enum) and in 2.13.0's ``torch/amp/grad_scaler.py``; and they see a skipped step
through ``Optimizer.register_step_post_hook``, new in torch 2.0 (pytorch PR 89176). So:
torch >= 2.0 with a CUDA ``GradScaler``, and >= 2.3 for ``torch.amp.GradScaler("cpu")``
(the first with CPU kernels). Run on 2.13.0 (CI). 2.14.1's ``torch/amp/grad_scaler.py`` is
byte for byte 2.13.0's (its wheel here is a CUDA build that does not import without the CUDA
libraries); 2.0 to 2.12 are supported by the source only.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..scaling import ScalerState, found_inf, preset, unscale
from .trace import TraceStep, TraceWriter

if TYPE_CHECKING:       # torch is imported when an adapter is made (_torch)
    from torch.utils.hooks import RemovableHandle

__all__ = ["GradScalerAdapter", "GradScalerRecorder", "check_unscale", "UnscaleCheck",
           "gradscaler_params", "found_inf_of", "grad_stats", "check_supported",
           "unsupported_reason", "open_scaler_trace", "OLDEST_TORCH"]

OLDEST_TORCH = (2, 0)          # Optimizer.register_step_post_hook
_SCALER_MEMBERS = ("_scale", "_get_growth_tracker", "_found_inf_per_device",
                   "_per_optimizer_states")


def _torch():
    try:
        import torch
    except ImportError as err:
        raise ImportError("the PyTorch adapter needs torch: pip install torch==2.13.0 "
                          "(the CPU build is enough)") from err
    return torch


def unsupported_reason(torch_version: str, scaler, optimizer_class) -> "str | None":
    """Why a recorder cannot read this torch's GradScaler, or None: a torch older than
    ``OLDEST_TORCH``, or a scaler or optimizer class without the members it reads."""
    numbers = re.match(r"(\d+)\.(\d+)", str(torch_version))
    if numbers is None or tuple(map(int, numbers.groups())) < OLDEST_TORCH:
        return (f"torch {torch_version} is not supported: the recorders need torch >= "
                f"{OLDEST_TORCH[0]}.{OLDEST_TORCH[1]} (Optimizer.register_step_post_hook; "
                f"GradScaler('cpu') needs 2.3)")
    missing = [name for name in _SCALER_MEMBERS if not hasattr(scaler, name)]
    if not hasattr(optimizer_class, "register_step_post_hook"):
        missing.append("Optimizer.register_step_post_hook")
    if missing:
        return (f"torch {torch_version}'s {type(scaler).__name__} lacks {', '.join(missing)}, "
                f"which the recorders read (as torch 2.0 to 2.14 have them)")
    return None


def check_supported(scaler) -> None:
    """Raise ``ValueError`` with ``unsupported_reason`` for this torch and ``scaler``."""
    torch = _torch()
    reason = unsupported_reason(torch.__version__, scaler, torch.optim.Optimizer)
    if reason is not None:
        raise ValueError(reason)


def gradscaler_params(scaler) -> dict:
    """A GradScaler's configuration in ``DynamicScaler`` field names (for trace headers)."""
    return {"init_scale": float(scaler.get_scale()),
            "growth_factor": float(scaler.get_growth_factor()),
            "backoff_factor": float(scaler.get_backoff_factor()),
            "growth_interval": int(scaler.get_growth_interval())}


def _version(torch) -> str:
    return f"torch {torch.__version__}"


def open_scaler_trace(scaler, target, *, source: "str | None" = None, framework: str = "",
                      attached: str = "recorder") -> TraceWriter:
    """Check that ``scaler`` can be recorded from its start and open its trace.

    Refuses (``ValueError``) a scaler ``check_supported`` refuses and one whose growth tracker
    is already running (the trace must start from the initial state; ``attached`` names what
    was attached too late in that message). Returns a ``TraceWriter`` on ``target`` whose
    header holds ``gradscaler_params(scaler)`` and ``source``, by default ``"<framework>
    torch <version> GradScaler('<device>')"`` (without the framework when it is empty)."""
    torch = _torch()
    check_supported(scaler)
    if scaler._scale is not None and int(scaler._get_growth_tracker()) != 0:
        raise ValueError(f"attach the {attached} before the GradScaler's first step: its "
                         f"growth tracker is already running")
    if source is None:
        device = getattr(scaler, "_device", "cpu")
        prefix = f"{framework} " if framework else ""
        source = f"{prefix}{_version(torch)} GradScaler({device!r})"
    return TraceWriter(target, source=source, params=gradscaler_params(scaler))


class GradScalerAdapter:
    """A real ``torch.amp.GradScaler`` as a conformance adapter.

    ``GradScalerAdapter(growth_interval=4)`` makes ``GradScaler("cpu", growth_interval=4)``;
    ``GradScalerAdapter(scaler=existing)`` wraps one (which must not have stepped yet).

    >>> from fpsim.conformance import compare
    >>> compare(GradScalerAdapter(growth_interval=3), [False] * 7 + [True], "torch",
    ...         growth_interval=3).agree
    True
    """

    def __init__(self, scaler=None, *, device: str = "cpu", **gradscaler_kwargs) -> None:
        torch = _torch()
        self._torch = torch
        if scaler is None:
            scaler = torch.amp.GradScaler(device, **gradscaler_kwargs)
        elif gradscaler_kwargs:
            raise ValueError("pass either a GradScaler or its keyword arguments, not both")
        check_supported(scaler)
        self.scaler = scaler
        self.name = f"{_version(torch)} GradScaler({device!r})"
        self._param = torch.nn.Parameter(torch.zeros(1, device=device))
        self._optimizer = torch.optim.SGD([self._param], lr=0.0)
        self._stepped = False
        self._skipped: bool | None = None
        self._optimizer.register_step_post_hook(self._on_step)
        self._one = torch.ones((), dtype=torch.float32, device=device)
        self._grads = {True: torch.full((1,), math.inf, device=device),
                       False: torch.ones(1, device=device)}
        scaler.scale(self._one)          # materialise the float32 scale tensor (lazy init)

    def _on_step(self, *_args) -> None:
        self._stepped = True

    @property
    def scale(self) -> float:
        return float(self.scaler.get_scale())

    def update(self, found_inf: bool) -> float:
        self.scaler.scale(self._one)
        self._param.grad = self._grads[bool(found_inf)].clone()
        self._stepped = False
        self.scaler.step(self._optimizer)
        self.scaler.update()
        self._skipped = not self._stepped
        return float(self.scaler.get_scale())

    def state(self) -> dict:
        return {"growth_tracker": int(self.scaler._get_growth_tracker()),
                "skipped": self._skipped}


class GradScalerRecorder:
    """Record a training run's GradScaler to a trace: call ``recorder.step(optimizer)``
    where the loop had ``scaler.step(optimizer); scaler.update()``.

    ::

        scaler = torch.amp.GradScaler("cpu")
        with GradScalerRecorder(scaler, "run.jsonl") as recorder:
            for x, y in data:
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                recorder.step(optimizer)          # scaler.step + scaler.update, recorded

    Attach it before the scaler's first step (the trace starts from the initial state).
    Several optimizers under one scaler (torch's ``scaler.step(o1); scaler.step(o2);
    scaler.update()``) are passed together, ``recorder.step([o1, o2])``: one trace line per
    update, ``found_inf`` if any optimizer's gradients held inf/NaN, ``skipped`` if any
    optimizer's step was skipped. Each call must pass the same optimizers: calling
    ``step(o1)`` then ``step(o2)`` would update the scaler twice per iteration (and unscale
    o2's gradients with the updated scale), so it is refused. ``grad_stats=False`` leaves out
    the gradient statistics.
    """

    def __init__(self, scaler, target, *, source: str | None = None,
                 grad_stats: bool = True) -> None:
        self._writer = open_scaler_trace(scaler, target, source=source)
        self.scaler, self._with_stats = scaler, grad_stats
        self._hooked: dict[int, RemovableHandle] = {}
        self._optimizers: "tuple[int, ...] | None" = None
        self._stepped: set[int] = set()
        self.steps = 0

    def _hook(self, optimizer) -> None:
        if id(optimizer) not in self._hooked:
            self._hooked[id(optimizer)] = optimizer.register_step_post_hook(
                lambda *_args: self._stepped.add(id(optimizer)))

    def step(self, optimizers, *args, **kwargs):
        """``scaler.step(o, ...)`` for the optimizer (or each of a list of them), then one
        ``scaler.update()``, recorded; returns what ``scaler.step`` returned (a list for a
        list)."""
        several = isinstance(optimizers, (list, tuple))
        chosen = list(optimizers) if several else [optimizers]
        ids = tuple(id(o) for o in chosen)
        if not chosen or len(set(ids)) != len(ids):
            raise ValueError("GradScalerRecorder.step takes an optimizer or a list of distinct "
                             "optimizers")
        if self._optimizers is None:
            self._optimizers = ids
        elif ids != self._optimizers:
            raise ValueError(f"GradScalerRecorder.step was given {len(self._optimizers)} "
                             f"optimizer(s) before and now {len(ids)} other(s): one call per "
                             f"iteration with every optimizer the scaler serves, "
                             f"recorder.step([o1, o2]) (stepping them one by one would update "
                             f"the scaler once per optimizer)")
        for optimizer in chosen:
            self._hook(optimizer)
        scaler = self.scaler
        scale_before = float(scaler.get_scale())
        self._stepped.clear()
        results = [scaler.step(o, *args, **kwargs) for o in chosen]
        found = found_inf_of(scaler, chosen)
        stats = grad_stats(chosen) if self._with_stats else None
        scaler.update()
        self._writer.write(TraceStep(
            self.steps, found, scale_before, float(scaler.get_scale()),
            len(self._stepped) < len(chosen), growth_tracker=int(scaler._get_growth_tracker()),
            grad_stats=stats))
        self.steps += 1
        return results if several else results[0]

    def close(self) -> None:
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        self._writer.close()

    def __enter__(self) -> "GradScalerRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def found_inf_of(scaler, optimizers) -> bool:
    """torch's own overflow decision for the optimizers' gradients: any non-zero
    ``found_inf`` that ``unscale_`` (run by ``scaler.step`` if not before) left per device,
    the value ``scaler.step`` skips on and ``scaler.update`` reads."""
    return sum(float(v.item()) for o in optimizers
               for v in scaler._found_inf_per_device(o).values()) != 0.0


def grad_stats(optimizers) -> dict:
    """Statistics of the optimizers' gradients as GradScaler left them (unscaled): element
    count, how many are inf/NaN, the largest finite magnitude, the float64 norm of the finite
    ones."""
    count = nonfinite = 0
    max_abs, square_sum = 0.0, 0.0
    for group in (g for optimizer in optimizers for g in optimizer.param_groups):
        for param in group["params"]:
            if param.grad is None:
                continue
            grad = param.grad.detach().float().cpu().numpy().astype(np.float64).ravel()
            finite = grad[np.isfinite(grad)]
            count += grad.size
            nonfinite += grad.size - finite.size
            if finite.size:
                max_abs = max(max_abs, float(np.max(np.abs(finite))))
                square_sum += float(np.dot(finite, finite))
    return {"count": count, "nonfinite": nonfinite, "max_abs": max_abs,
            "l2_norm": math.sqrt(square_sum)}


class UnscaleCheck(NamedTuple):
    """``check_unscale``'s outcome: both ``inv_scale`` values, both ``found_inf`` values and
    the indices of gradients whose unscaled bits differ (NaN meets NaN)."""

    agree: bool
    inv_scale_ours: float
    inv_scale_torch: float
    found_inf_ours: bool
    found_inf_torch: bool
    mismatches: np.ndarray


def check_unscale(grads: np.ndarray, scale: float) -> UnscaleCheck:
    """Unscale float32 ``grads`` with a real ``GradScaler("cpu", init_scale=scale)`` (its
    ``unscale_``, which runs ``torch._amp_foreach_non_finite_check_and_unscale_``) and with
    ``fpsim.scaling.unscale``; compare bit for bit."""
    torch = _torch()
    grads = np.asarray(grads)
    if grads.dtype != np.float32 or grads.ndim != 1:
        raise TypeError(f"grads must be a 1-d float32 array, got {grads.dtype} with shape "
                        f"{grads.shape}")
    scaler = torch.amp.GradScaler("cpu", init_scale=float(scale))
    param = torch.nn.Parameter(torch.zeros(grads.size + 1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler.scale(torch.ones(()))
    param.grad = torch.from_numpy(np.concatenate([grads, np.array([1.0], np.float32)]))
    scaler.unscale_(optimizer)
    theirs = param.grad.numpy()
    found_torch = found_inf_of(scaler, [optimizer])
    state = ScalerState(scaler=preset("torch"), scale=float(scaler.get_scale()))
    ours = unscale(grads, state)
    inv_torch = float(theirs[-1])
    mismatches = _bit_mismatches(ours, theirs[:-1])
    found_ours = found_inf(grads)
    same_inv = np.float32(state.inv_scale).view(np.uint32) == np.float32(inv_torch).view(
        np.uint32)
    agree = bool(same_inv) and found_ours == found_torch and mismatches.size == 0
    return UnscaleCheck(agree, state.inv_scale, inv_torch, found_ours, found_torch, mismatches)


def _bit_mismatches(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    differ &= ~(nan_ours & nan_theirs)
    return np.flatnonzero(differ | (nan_ours != nan_theirs))
