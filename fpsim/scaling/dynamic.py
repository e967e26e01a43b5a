"""One dynamic loss-scaling algorithm whose parameters cover the real implementations.

Every framework's dynamic scaler is the same idea (skip and shrink on overflow, grow after a
run of clean steps) with different details, and the details decide the trajectory bit for
bit. ``DynamicScaler`` names each detail as a parameter; ``fpsim.scaling.preset`` fills them
in per framework. The algorithm, for one update::

    if found_inf:                                   # the step is skipped (skip_on_overflow)
        tracker = tracker_start                     # 0; DeepSpeed -1 (see presets)
        if hysteresis_left <= 1:                    # no hysteresis left: back off
            if raise_at_min and scale == min_scale: raise LossScaleMinimumError
            scale = backoff(scale)                  # scale * f or scale / f, in `precision`
            scale = max(scale, min_scale)           # if min_scale is set
            if hysteresis_decrement_on_backoff: hysteresis_left -= 1   # Megatron: may go < 1
        else:
            hysteresis_left -= 1                    # absorbed: the scale stays
    else:
        if hysteresis_refill == "clean": hysteresis_left = hysteresis
        due = tracker + 1 == growth_interval        # ">=" with growth_compare="ge" (tf-keras)
        if due:
            new = grow(scale)                       # scale * growth_factor, in `precision`
            new = min(new, max_scale)               # if max_scale is set (apex)
            if not finite_guard or isfinite(new): scale = new
            tracker = 0                             # reset even when the growth was blocked
            if hysteresis_refill == "growth": hysteresis_left = hysteresis
        else:
            tracker = tracker + 1                   # (tracker + 1) % interval with tracker_wraps

``precision`` is the arithmetic of the scale:

``"float64_to_float32"``
    torch: the float32 scale times a float64 factor, computed in float64 and stored back as
    float32 (one rounding, to float32, from the float64 product).
``"float32"``
    Megatron, tf-keras, Keras 3, jmp: the factor is rounded to float32 and the product is a
    float32 operation. The initial, minimum and maximum scales are rounded to float32 too.
``"float32_ftz"``
    ``"float32"`` on XLA's CPU backend (Keras 3 on jax, jmp eager), which flushes subnormal
    results to zero: a scale halved from 2**-126 becomes 0, not 2**-127 (no preset's default;
    ``preset("keras3", precision="float32_ftz")``).
``"float64"``
    apex and DeepSpeed keep the scale in a Python float.

The state never leaves the format: a float32 scale can overflow to inf (where no finite guard
stops it) or underflow through the subnormals to 0 (where no floor stops it), and then stays
there, exactly as the frameworks do.

>>> s = DynamicScaler(init_scale=8.0, growth_interval=3).init()
>>> for found in (False, False, True, False, False, False):
...     s = s.update(found)
>>> s.scale, s.growths, s.backoffs, s.total_skips
(8.0, 1, 1, 1)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from .. import backend
from ..backend import xp
from ..options import check_choice, check_count, check_flag, check_real

from .numerics import FOUND_INF_METHODS
from .state import Decision, LossScaleMinimumError, ScalerState

__all__ = ["DynamicScaler", "PRECISIONS", "trajectory"]

PRECISIONS = ("float64_to_float32", "float32", "float64", "float32_ftz")
_FLT_MIN_NORMAL = 2.0 ** -126
BACKOFF_OPS = ("multiply", "divide")
GROWTH_COMPARES = ("eq", "ge")
HYSTERESIS_REFILLS = ("growth", "clean")
OVERFLOW_CHECKS = FOUND_INF_METHODS      # how check_overflow judges (numerics.found_inf)
UNSCALE_OPS = ("reciprocal", "divide")


@dataclass(frozen=True)
class DynamicScaler:
    """Configuration of a dynamic loss scaler; ``init()`` gives its first ``ScalerState``.

    The defaults are torch's ``GradScaler``. Parameters (see the module docstring for the
    algorithm):

    init_scale, growth_factor, growth_interval
        The first scale; the growth multiplier (> 1); clean steps per growth (>= 1).
    backoff_factor, backoff_op
        ``"multiply"``: the scale is multiplied by ``backoff_factor`` in (0, 1) (torch,
        Megatron). ``"divide"``: divided by ``backoff_factor`` > 1 (apex, DeepSpeed, Keras,
        jmp write ``scale / 2``). The two agree for powers of two only.
    precision
        ``"float64_to_float32"``, ``"float32"`` or ``"float64"``: see the module docstring.
    growth_compare
        ``"eq"``: grow when ``tracker + 1 == growth_interval`` (a tracker beyond the interval,
        e.g. after lowering the interval, never grows again until an overflow resets it, as in
        torch); ``"ge"``: ``>=`` (tf-keras).
    tracker_start, tracker_wraps
        The tracker's value at the start and after every overflow (DeepSpeed's iteration
        arithmetic amounts to -1: its first growth needs ``growth_interval + 1`` clean
        steps); ``tracker_wraps`` counts ``(tracker + 1) % growth_interval`` (jmp).
    finite_guard
        Keep the old scale when the grown one is not finite (torch, tf-keras, jmp).
    min_scale, max_scale
        Floor applied to backoffs (``max(new, min_scale)``) and ceiling applied to growths
        (``min(new, max_scale)``); None for none.
    hysteresis, hysteresis_refill, hysteresis_decrement_on_backoff
        Overflows tolerated before a backoff (1: none); when the count is refilled
        (``"growth"``: Megatron, DeepSpeed; ``"clean"``: every clean step, DeepSpeed's
        ``consecutive_hysteresis``); whether a backoff still decrements it (Megatron: yes, it
        goes to 0, -1, ...; DeepSpeed: no, it stays at 1).
    raise_at_min
        Raise ``LossScaleMinimumError`` when a backoff is due at ``scale == min_scale``
        (DeepSpeed's ``raise_error_at_min_scale``).
    overflow_check, check_unscaled, unscale_op
        How ``check_overflow`` and ``unscale`` treat gradients: ``"nonfinite"`` (any inf or
        NaN) or ``"sum"`` (the float32 sum is not finite: DeepSpeed's FP16_Optimizer up to
        0.19.5 and apex's Python fallback); judged on the scaled gradients or on the unscaled
        ones (tf-keras, jmp); unscaling by ``"reciprocal"`` (multiply by ``inv_scale``) or
        ``"divide"`` (Keras 3 divides by the scale).
    skip_on_overflow
        Whether an overflow skips the optimizer step (every framework: yes).
    name, source
        A label and the source code the configuration follows (not compared).
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    backoff_op: str = "multiply"
    growth_interval: int = 2000
    precision: str = "float64_to_float32"
    growth_compare: str = "eq"
    tracker_start: int = 0
    tracker_wraps: bool = False
    finite_guard: bool = True
    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int = 1
    hysteresis_refill: str = "growth"
    hysteresis_decrement_on_backoff: bool = False
    raise_at_min: bool = False
    overflow_check: str = "nonfinite"
    check_unscaled: bool = False
    unscale_op: str = "reciprocal"
    skip_on_overflow: bool = True
    name: str = field(default="dynamic", compare=False)
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    # --- the values as the framework stores them ------------------------------------------
    def stored(self, value: float) -> float:
        """``value`` as this scaler stores a scale: rounded to float32 unless the precision
        is ``"float64"``."""
        if self.precision == "float64":
            return float(value)
        with xp.errstate(over="ignore"):
            stored = float(backend.scalar(value, xp.float32))
        return _flushed(stored) if self.precision == "float32_ftz" else stored

    @property
    def min_value(self) -> float | None:
        return None if self.min_scale is None else self.stored(self.min_scale)

    @property
    def max_value(self) -> float | None:
        return None if self.max_scale is None else self.stored(self.max_scale)

    def grow(self, scale: float) -> float:
        """``scale`` times ``growth_factor`` in this scaler's arithmetic (no ceiling, guard)."""
        return _combine(scale, self.growth_factor, "multiply", self.precision)

    def backoff(self, scale: float) -> float:
        """``scale`` backed off once in this scaler's arithmetic (no floor)."""
        return _combine(scale, self.backoff_factor, self.backoff_op, self.precision)

    # --- the protocol -----------------------------------------------------------------------
    def init(self) -> ScalerState:
        """The state before the first step."""
        return ScalerState(scaler=self, scale=self.stored(self.init_scale),
                           growth_tracker=self.tracker_start, hysteresis_left=self.hysteresis)

    def advance(self, state: ScalerState, found_inf: bool) -> ScalerState:
        """The state after one update (``ScalerState.update`` calls this)."""
        scale, tracker, hyst = state.scale, state.growth_tracker, state.hysteresis_left
        new_scale, new_tracker, new_hyst = scale, tracker, hyst
        grew = backed_off = absorbed = floored = False
        blocked = None
        if found_inf:
            new_tracker = self.tracker_start
            if hyst <= 1:
                floor = self.min_value
                if self.raise_at_min and floor is not None and scale == floor:
                    raise LossScaleMinimumError(state)
                new_scale = self.backoff(scale)
                if floor is not None and new_scale < floor:
                    new_scale, floored = floor, True
                backed_off = True
                if self.hysteresis_decrement_on_backoff:
                    new_hyst = hyst - 1
            else:
                new_hyst, absorbed = hyst - 1, True
        else:
            if self.hysteresis_refill == "clean":
                new_hyst = self.hysteresis
            reached = tracker + 1
            due = (reached == self.growth_interval if self.growth_compare == "eq"
                   else reached >= self.growth_interval)
            if due:
                candidate = self.grow(scale)
                ceiling = self.max_value
                if ceiling is not None and candidate > ceiling:
                    candidate, blocked = ceiling, "max_scale"
                if self.finite_guard and not math.isfinite(candidate):
                    candidate, blocked = scale, "nonfinite"
                new_scale = candidate
                grew = new_scale > scale
                new_tracker = reached % self.growth_interval if self.tracker_wraps else 0
                if self.hysteresis_refill == "growth":
                    new_hyst = self.hysteresis
            else:
                new_tracker = reached % self.growth_interval if self.tracker_wraps else reached
        skipped = found_inf and self.skip_on_overflow
        decision = Decision(
            step=state.step, found_inf=found_inf, skipped=skipped, scale_before=scale,
            scale_after=new_scale, grew=grew, backed_off=backed_off,
            hysteresis_absorbed=absorbed, growth_blocked=blocked, floored=floored,
            growth_tracker_before=tracker, growth_tracker_after=new_tracker,
            hysteresis_before=hyst, hysteresis_after=new_hyst)
        return ScalerState(
            scaler=self, scale=new_scale, growth_tracker=new_tracker, hysteresis_left=new_hyst,
            step=state.step + 1,
            last_overflow_step=state.step if found_inf else state.last_overflow_step,
            consecutive_skips=state.consecutive_skips + 1 if skipped else 0,
            total_skips=state.total_skips + skipped,
            total_overflows=state.total_overflows + found_inf,
            growths=state.growths + grew, backoffs=state.backoffs + backed_off,
            decision=decision)


def trajectory(start, found_infs) -> list[ScalerState]:
    """The states after each of ``found_infs`` (booleans), starting from ``start`` (a state or
    a scaler, which is ``init()``-ed); ``len(found_infs) + 1`` states, the start first."""
    state = start if isinstance(start, ScalerState) else start.init()
    states = [state]
    for flag in found_infs:
        state = state.update(bool(flag))
        states.append(state)
    return states


def _combine(scale: float, factor: float, op: str, precision: str) -> float:
    with xp.errstate(over="ignore", under="ignore"):
        if precision == "float64":
            return scale * factor if op == "multiply" else scale / factor
        if precision in ("float32", "float32_ftz"):
            a, b = backend.scalar(scale, xp.float32), backend.scalar(factor, xp.float32)
            result = float(a * b if op == "multiply" else a / b)
            return _flushed(result) if precision == "float32_ftz" else result
        wide = scale * float(factor) if op == "multiply" else scale / float(factor)
        return float(backend.scalar(wide, xp.float32))


def _flushed(value: float) -> float:
    """A subnormal float32 value flushed to a zero of its sign (XLA CPU's FTZ)."""
    return math.copysign(0.0, value) if 0 < abs(value) < _FLT_MIN_NORMAL else value


def _validate(cfg: DynamicScaler) -> None:
    for name, options in (("precision", PRECISIONS), ("backoff_op", BACKOFF_OPS),
                          ("growth_compare", GROWTH_COMPARES),
                          ("hysteresis_refill", HYSTERESIS_REFILLS),
                          ("overflow_check", OVERFLOW_CHECKS), ("unscale_op", UNSCALE_OPS)):
        check_choice(name, getattr(cfg, name), options)
    check_real("init_scale", cfg.init_scale, "a positive scale")
    if not cfg.init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {cfg.init_scale!r}")
    stored = cfg.stored(cfg.init_scale)
    if not (math.isfinite(stored) and stored > 0):
        raise ValueError(f"init_scale={cfg.init_scale!r} is {stored!r} in {cfg.precision} "
                         f"storage; give a value that stays finite and positive")
    check_real("growth_factor", cfg.growth_factor, "> 1")
    if not cfg.growth_factor > 1:
        raise ValueError(f"growth_factor must be > 1, got {cfg.growth_factor!r}")
    check_real("backoff_factor", cfg.backoff_factor, "see backoff_op")
    if cfg.backoff_op == "multiply" and not 0 < cfg.backoff_factor < 1:
        raise ValueError(f"backoff_factor must be in (0, 1) with backoff_op='multiply' (the "
                         f"scale is multiplied by it), got {cfg.backoff_factor!r}")
    if cfg.backoff_op == "divide" and not cfg.backoff_factor > 1:
        raise ValueError(f"backoff_factor must be > 1 with backoff_op='divide' (the scale is "
                         f"divided by it), got {cfg.backoff_factor!r}")
    for name in ("growth_factor", "backoff_factor"):
        stored_factor = cfg.stored(getattr(cfg, name))
        if not (math.isfinite(stored_factor) and stored_factor > 0):
            raise ValueError(f"{name}={getattr(cfg, name)!r} is {stored_factor!r} in "
                             f"{cfg.precision} arithmetic; give a finite positive factor")
    check_count("growth_interval", cfg.growth_interval, 1)
    check_count("hysteresis", cfg.hysteresis, 1)
    check_count("tracker_start", cfg.tracker_start, -(2 ** 31))
    if cfg.tracker_start >= cfg.growth_interval:
        raise ValueError(f"tracker_start={cfg.tracker_start} must be below growth_interval="
                         f"{cfg.growth_interval}")
    for name in ("min_scale", "max_scale"):
        value = getattr(cfg, name)
        if value is not None:
            check_real(name, value, "a positive scale, or None for no bound")
            if not value > 0 or not 0 < cfg.stored(value) < math.inf:
                raise ValueError(f"{name} must be > 0 and finite in {cfg.precision} storage "
                                 f"(None for no bound), got {value!r}")
    if cfg.min_scale is not None and cfg.max_scale is not None and cfg.min_scale > cfg.max_scale:
        raise ValueError(f"min_scale={cfg.min_scale!r} is above max_scale={cfg.max_scale!r}")
    if cfg.raise_at_min and cfg.min_scale is None:
        raise ValueError("raise_at_min=True needs a min_scale")
    for name in ("tracker_wraps", "finite_guard", "hysteresis_decrement_on_backoff",
                 "raise_at_min", "check_unscaled", "skip_on_overflow"):
        check_flag(name, getattr(cfg, name))
