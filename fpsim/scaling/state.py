"""The scaler state and the record of one decision: immutable values, new ones per step.

A ``ScalerState`` is what a loss scaler carries from one training step to the next: the scale
itself, the counters its algorithm needs (growth tracker, hysteresis left), and counters that
explain its history (steps, skips, growths, backoffs). ``state.update(found_inf)`` returns the
next state; the old one is untouched (the jmp style). Every state after the first carries the
``Decision`` that produced it, so a trajectory of states explains itself step by step.

>>> from fpsim.scaling import preset
>>> s = preset("torch", growth_interval=2).init()
>>> s = s.update(False).update(False)         # two clean steps: the scale doubles
>>> s.scale, s.decision.grew
(131072.0, True)
>>> s = s.update(True)                        # an overflow: skip the step, halve the scale
>>> s.scale, s.decision.skipped, s.total_skips
(65536.0, True, 1)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import backend
from ..backend import xp

__all__ = ["ScalerState", "Decision", "LossScaleMinimumError"]


class LossScaleMinimumError(RuntimeError):
    """An overflow came while the scale was already at its minimum, and the scaler is set to
    stop there (``raise_at_min=True``), as DeepSpeed's ``DynamicLossScaler.update_scale`` does
    ("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.").

    ``state`` is the state before the failing update; ``step`` the index of that update.
    """

    def __init__(self, state: "ScalerState") -> None:
        self.state = state
        self.step = state.step
        super().__init__(
            f"overflow at step {state.step} with the loss scale already at its minimum "
            f"{state.scale!r} (raise_at_min=True, as DeepSpeed's DynamicLossScaler): the scale "
            f"cannot go lower; lower min_scale or set raise_at_min=False to keep going")


@dataclass(frozen=True)
class Decision:
    """What one ``update`` saw and did, with the values that explain it.

    ``step`` is the 0-based index of the update. ``found_inf`` is what it was told;
    ``skipped`` whether the optimizer step is to be skipped. At most one of ``grew``,
    ``backed_off`` and ``hysteresis_absorbed`` is true. ``growth_blocked`` says why a growth
    that was due left the scale where it was or capped it: ``"nonfinite"`` (the grown scale
    would not be finite, torch/tf-keras/jmp keep the old one), ``"max_scale"`` (apex's
    ceiling), or None. ``floored`` is true when a backoff was clamped up to ``min_scale``.
    """

    step: int
    found_inf: bool
    skipped: bool
    scale_before: float
    scale_after: float
    grew: bool = False
    backed_off: bool = False
    hysteresis_absorbed: bool = False
    growth_blocked: str | None = None
    floored: bool = False
    growth_tracker_before: int = 0
    growth_tracker_after: int = 0
    hysteresis_before: int = 1
    hysteresis_after: int = 1

    @property
    def action(self) -> str:
        """One word for what happened to the scale: ``grow``, ``backoff``, ``hysteresis``,
        ``blocked`` (a growth was due but did not happen) or ``hold``."""
        if self.grew:
            return "grow"
        if self.backed_off:
            return "backoff"
        if self.hysteresis_absorbed:
            return "hysteresis"
        if self.growth_blocked is not None:
            return "blocked"
        return "hold"

    @property
    def reason(self) -> str:
        """The decision in one sentence."""
        seen = "overflow" if self.found_inf else "finite gradients"
        skip = "step skipped" if self.skipped else "step applied"
        before, after = self.scale_before, self.scale_after
        if self.grew:
            what = f"growth due (tracker {self.growth_tracker_before}+1 reached the interval)"
            if self.growth_blocked == "max_scale":
                what += ", capped at max_scale"
            what += f": scale {before!r} -> {after!r}"
        elif self.backed_off:
            what = f"backoff: scale {before!r} -> {after!r}"
            if self.floored:
                what += " (clamped to min_scale)"
        elif self.hysteresis_absorbed:
            what = (f"hysteresis absorbed it ({self.hysteresis_before} -> "
                    f"{self.hysteresis_after} left): scale stays {before!r}")
        elif self.growth_blocked == "nonfinite":
            what = f"growth due but the grown scale is not finite: scale stays {before!r}"
        elif self.growth_blocked == "max_scale":
            what = f"growth due but capped at max_scale: scale {before!r} -> {after!r}"
        else:
            what = (f"tracker {self.growth_tracker_before} -> {self.growth_tracker_after}: "
                    f"scale stays {before!r}")
        return f"step {self.step}: {seen}, {skip}; {what}"

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class ScalerState:
    """The state of a loss scaler between steps; ``update(found_inf)`` gives the next one.

    ``scale`` is the exact value of the scale as the framework holds it (a float32 value for
    float32 scalers), as a Python float. ``growth_tracker`` counts the clean steps that count
    toward the next growth (it starts at the scaler's ``tracker_start``, -1 for DeepSpeed);
    ``hysteresis_left`` the overflows still to be absorbed before a backoff (Megatron lets it
    go below 1). ``step`` counts updates so far; ``last_overflow_step`` is the index of the
    last update that saw an overflow (-1: none yet). The other counters explain the history:
    consecutive and total skips, total overflows, growths and backoffs. ``decision`` records
    the update that made this state (None for the initial state).
    """

    scaler: Any
    scale: float
    growth_tracker: int = 0
    hysteresis_left: int = 1
    step: int = 0
    last_overflow_step: int = -1
    consecutive_skips: int = 0
    total_skips: int = 0
    total_overflows: int = 0
    growths: int = 0
    backoffs: int = 0
    decision: Decision | None = None

    def update(self, found_inf) -> "ScalerState":
        """The next state after a step whose gradients did (True) or did not (False) hold an
        inf or NaN. Pure: ``self`` is not changed."""
        return self.scaler.advance(self, _as_flag(found_inf))

    @property
    def inv_scale(self) -> float:
        """The reciprocal used to unscale, as torch's GradScaler makes it:
        ``float32(1 / float64(scale))`` (``scale.double().reciprocal().float()``; a scale of
        0 gives inf). The same as float32 division ``1/scale``: double rounding is harmless
        for division from 53 to 24 bits."""
        return inverse_scale(self.scale)

    @property
    def skipped(self) -> bool:
        """Whether the last update skipped its step (False for the initial state)."""
        return self.decision is not None and self.decision.skipped

    def __repr__(self) -> str:
        name = getattr(self.scaler, "name", type(self.scaler).__name__)
        return (f"ScalerState({name}: scale={self.scale!r}, tracker={self.growth_tracker}, "
                f"hysteresis={self.hysteresis_left}, step={self.step}, "
                f"skips={self.consecutive_skips}/{self.total_skips})")


def inverse_scale(scale: float) -> float:
    """``float32(1 / float64(scale))``; 1/0 is inf as in torch, not a ZeroDivisionError."""
    if scale == 0.0:
        return math.inf
    with xp.errstate(over="ignore", under="ignore"):
        return float(backend.scalar(1.0 / float(scale), xp.float32))


def _as_flag(found_inf) -> bool:
    if isinstance(found_inf, (bool, xp.bool_)):
        return bool(found_inf)
    if backend.is_array_like(found_inf):
        array = xp.asarray(found_inf)
        if array.dtype == xp.bool_ and array.ndim == 0:
            return bool(array)
    raise TypeError(f"found_inf must be a bool (did the step's gradients hold an inf or NaN?), "
                    f"got {type(found_inf).__name__} {found_inf!r}; "
                    f"fpsim.scaling.found_inf(grads) computes it")
