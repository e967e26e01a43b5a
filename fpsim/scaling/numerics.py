"""The arithmetic around a scaler: scaling the loss, unscaling gradients, detecting overflow.

Each function does what the frameworks' code does, with every rounding point explicit:

``scale_loss(loss, state, fmt=None)``
    torch ``GradScaler.scale``: ``loss * scale`` with the scale as a float32 value. A float32
    container multiplies in float32; a float64 container in float64. ``fmt`` then rounds the
    product once to a narrower format, as torch does for a float16/bfloat16 loss (its CPU and
    CUDA kernels multiply in float32 "opmath" and cast the product, so ``0.5 * 2**16`` is
    32768 in float16, not ``0.5 * float16(2**16) = inf``).
``unscale(grads, state, fmt=None)``
    torch ``_amp_foreach_non_finite_check_and_unscale_``: every gradient times
    ``inv_scale = float32(1 / float64(scale))``, in float32 (float64 for float64 gradients),
    untouched when ``inv_scale == 1``; ``fmt`` rounds the product (float16/bfloat16
    gradients). A state whose scaler has ``unscale_op="divide"`` (Keras 3) divides by the
    float32 scale instead.
``found_inf(grads, method="nonfinite")``
    Whether any gradient holds an inf or NaN (torch, Megatron, Keras, jmp, DeepSpeed 0.19.6),
    or with ``method="sum"`` whether a gradient's float32 sum is not finite (DeepSpeed's
    ``CheckOverflow._has_inf_or_nan`` up to 0.19.5 and apex's Python fallback:
    ``float(x.float().sum())``).
``check_overflow(scaled_grads, state, fmt=None)``
    The scaler's own rule: ``found_inf`` with its method, on the scaled gradients (torch,
    Megatron, apex, DeepSpeed, Keras 3) or on the unscaled ones (tf-keras, jmp).

The order matters in torch: ``found_inf`` is judged on the *scaled* gradients, before they are
multiplied by ``inv_scale``. With a scale below 1, a finite scaled gradient can turn into inf
when unscaled and nobody notices; with a scale of 0 every scaled gradient is 0 (finite),
``inv_scale`` is inf and the "unscaled" gradients are NaN, yet the step is not skipped.

>>> import numpy as np
>>> from fpsim.scaling import preset
>>> s = preset("torch").init()
>>> g = scale_loss(np.float32(3.0), s)
>>> g, unscale(g, s), found_inf([np.array([1.0, np.inf], np.float32)])
(np.float32(196608.0), np.float32(3.0), True)
"""
from __future__ import annotations

from .. import backend
from ..backend import xp

from ..backend import round_to
from ..options import check_choice

__all__ = ["scale_loss", "unscale", "found_inf", "check_overflow", "FOUND_INF_METHODS"]

FOUND_INF_METHODS = ("nonfinite", "sum")


def scale_loss(loss, state, fmt=None):
    """``loss * state.scale`` in the loss's container precision, then rounded to ``fmt``."""
    array, wrap = _container(loss, "loss")
    with xp.errstate(over="ignore", invalid="ignore"):
        product = array * backend.scalar(state.scale, array.dtype)   # float32(scale) for float32
    if fmt is not None:
        product = round_to(product, fmt)
    return wrap(product)


def unscale(grads, state, fmt=None, *, copy: bool = True):
    """Gradients divided by the scale the way the state's framework does it (see the module
    docstring). ``grads``: an array/scalar or a list/tuple of them; the same structure comes
    back, new arrays, the inputs untouched. ``copy=False``: where ``inv_scale`` is 1 (and no
    ``fmt``), the input arrays themselves come back instead of copies of the same values
    (for a caller that only reads them)."""
    divide = getattr(state.scaler, "unscale_op", "reciprocal") == "divide"
    factor = state.scale if divide else state.inv_scale

    def one(grad):
        array, wrap = _container(grad, "gradient")
        if divide:
            out = array / backend.scalar(factor, array.dtype)
        elif factor == 1.0:
            out = backend.copy(array) if copy and fmt is None else array   # round_to copies
        else:
            out = array * backend.scalar(factor, array.dtype)
        if fmt is not None:
            out = round_to(out, fmt)
        return wrap(out)

    with xp.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if isinstance(grads, (list, tuple)):
            return type(grads)([one(g) for g in grads])
        return one(grads)


def found_inf(grads, method: str = "nonfinite") -> bool:
    """True when the gradients overflowed, judged by ``method``:

    ``"nonfinite"``: any element is inf or NaN.
    ``"sum"``: for some gradient, the float32 sum of its elements is inf or NaN, as DeepSpeed's
    non-ZeRO optimizers up to 0.19.5 (``deepspeed/runtime/utils.py``
    ``CheckOverflow._has_inf_or_nan``; 0.19.6 tests ``amax``/``amin``: ``"nonfinite"``) and
    apex's ``scale_check_overflow_python`` test it. Any inf/NaN element makes the sum
    non-finite in every order of summation, so this flags everything ``"nonfinite"`` flags,
    and also all-finite gradients whose sum overflows float32 (a false overflow: e.g. float32
    master gradients ``[3e38, 3e38]``). The sum runs in NumPy's float32 pairwise order;
    torch's CPU order differs, which can only matter when partial sums land within rounding
    of the float32 overflow threshold.
    """
    check_choice("found_inf method", method, FOUND_INF_METHODS)
    arrays = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    for grad in arrays:
        array, _ = _container(grad, "gradient")
        if method == "nonfinite":
            if not xp.all(xp.isfinite(array)):
                return True
        else:
            with xp.errstate(over="ignore", invalid="ignore"):
                total = xp.sum(backend.astype(array, xp.float32, copy=False), dtype=xp.float32)
            if not xp.isfinite(total):
                return True
    return False


def check_overflow(scaled_grads, state, fmt=None) -> bool:
    """The state's framework's overflow test of one step's scaled gradients; ``fmt`` is the
    gradients' format, used when the test runs on unscaled gradients."""
    scaler = state.scaler
    grads = unscale(scaled_grads, state, fmt) if scaler.check_unscaled else scaled_grads
    return found_inf(grads, scaler.overflow_check)


def _container(x, what: str):
    if isinstance(x, float):
        return xp.asarray(x, xp.float64), lambda out: float(out[()])
    if isinstance(x, (xp.float32, xp.float64)):
        return xp.asarray(x), lambda out: out[()]
    if not backend.is_array_like(x):
        raise TypeError(f"{what} must be a float32/float64 array or scalar, got "
                        f"{type(x).__name__}")
    array = xp.asarray(x)           # a host array on another backend: moved, not copied here
    if array.dtype not in (xp.float32, xp.float64):
        raise TypeError(f"{what} must be float32 or float64 data, got {array.dtype}; "
                        f"hold float16/bfloat16 values in float32 and pass fmt=")
    return array, lambda out: out
