"""Scalers whose scale never changes: ``StaticScaler`` (a fixed scale) and ``NoScaler``.

They share the dynamic scalers' protocol (``init()``, ``ScalerState.update(found_inf)``,
decisions and skip counters), so a training loop does not care which kind it holds.

What an overflow does differs between the frameworks, hence ``skip_on_overflow``:
Megatron's ``ConstantGradScaler`` still checks the gradients and skips the step on inf/NaN
(``MegatronOptimizer.step`` returns early on ``found_inf``); DeepSpeed's static
``LossScaler.has_overflow`` always answers False, so nothing is ever skipped; jmp's
``StaticLossScale``/``NoOpLossScale.adjust`` leave skipping to the caller. The defaults:
``StaticScaler`` skips (Megatron), ``NoScaler`` does not (plain float32/bfloat16 training).

>>> s = StaticScaler(1024.0).init().update(True).update(False)
>>> s.scale, s.total_skips, s.consecutive_skips
(1024.0, 1, 0)
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from .. import backend
from ..backend import xp

from ..options import check_choice, check_flag
from .dynamic import OVERFLOW_CHECKS, UNSCALE_OPS
from .state import Decision, ScalerState

__all__ = ["StaticScaler", "NoScaler"]


@dataclass(frozen=True)
class StaticScaler:
    """A fixed loss scale. ``precision``: ``"float32"`` stores it as a float32 value (Megatron's
    ``ConstantGradScaler`` tensor, torch-style unscaling), ``"float64"`` as a Python float
    (DeepSpeed's static ``LossScaler``)."""

    scale: float
    skip_on_overflow: bool = True
    precision: str = "float32"
    overflow_check: str = "nonfinite"
    check_unscaled: bool = False
    unscale_op: str = "reciprocal"
    name: str = field(default="static", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.scale, bool) or not isinstance(self.scale, numbers.Real):
            raise TypeError(f"scale must be a real number, got {type(self.scale).__name__}")
        check_choice("precision", self.precision, ("float32", "float64"))
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {self.scale!r}")
        if not (math.isfinite(self._stored()) and self._stored() > 0):
            raise ValueError(f"scale={self.scale!r} is not a positive finite float32 value")
        _check_common(self)

    def _stored(self) -> float:
        if self.precision == "float64":
            return float(self.scale)
        with xp.errstate(over="ignore"):
            return float(backend.scalar(self.scale, xp.float32))

    def init(self) -> ScalerState:
        return ScalerState(scaler=self, scale=self._stored())

    def advance(self, state: ScalerState, found_inf: bool) -> ScalerState:
        return _hold(self, state, found_inf)


@dataclass(frozen=True)
class NoScaler:
    """No loss scaling: the scale is 1.0 for ever. With ``skip_on_overflow`` an inf/NaN
    gradient still skips the step (some trainers do that in bfloat16 too)."""

    skip_on_overflow: bool = False
    overflow_check: str = "nonfinite"
    check_unscaled: bool = False
    unscale_op: str = "reciprocal"
    name: str = field(default="none", compare=False)

    def __post_init__(self) -> None:
        _check_common(self)

    def init(self) -> ScalerState:
        return ScalerState(scaler=self, scale=1.0)

    def advance(self, state: ScalerState, found_inf: bool) -> ScalerState:
        return _hold(self, state, found_inf)


def _check_common(cfg) -> None:
    check_flag("skip_on_overflow", cfg.skip_on_overflow)
    check_choice("overflow_check", cfg.overflow_check, OVERFLOW_CHECKS)
    check_choice("unscale_op", cfg.unscale_op, UNSCALE_OPS)


def _hold(cfg, state: ScalerState, found_inf: bool) -> ScalerState:
    skipped = found_inf and cfg.skip_on_overflow
    decision = Decision(step=state.step, found_inf=found_inf, skipped=skipped,
                        scale_before=state.scale, scale_after=state.scale)
    return ScalerState(
        scaler=cfg, scale=state.scale, step=state.step + 1,
        last_overflow_step=state.step if found_inf else state.last_overflow_step,
        consecutive_skips=state.consecutive_skips + 1 if skipped else 0,
        total_skips=state.total_skips + skipped,
        total_overflows=state.total_overflows + found_inf,
        decision=decision)
