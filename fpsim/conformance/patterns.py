"""Overflow patterns: sequences of ``found_inf`` flags that walk a scaler through its cases.

Each generator returns a NumPy bool array, the same for the same arguments (seeded with
``numpy.random.default_rng``). The shapes that matter for a loss scaler:

``random_flags``      independent overflows at a rate
``bursts``            runs of consecutive overflows scattered over clean steps
``clean_runs``        overflows separated by clean runs just under, at, just over and at
                      multiples of the growth interval (where off-by-one rules show)
``collapse``          an overflow every step until the scale stops moving (0 or the floor)
``growth_to_limit``   clean steps until the scale stops growing (the float32 limit, inf or a
                      ceiling), then some more

``standard_patterns(reference)`` names a set of them sized for one reference configuration;
``fpsim.conformance.strategies`` has the same shapes as hypothesis strategies.

>>> "".join("x" if f else "." for f in clean_runs(3, runs=1))
'..x..x...x....x.......x'
>>> from fpsim.scaling import preset
>>> len(collapse(preset("torch")))      # 166 halvings take 2**16 to 0, and a clean tail
216
"""
from __future__ import annotations

import math

import numpy as np

from ..options import check_count
from ..scaling import LossScaleMinimumError
from .replay import reference_state

__all__ = ["random_flags", "bursts", "clean_runs", "collapse", "growth_to_limit",
           "steps_to_collapse", "steps_to_limit", "standard_patterns"]


def _rng(seed):
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def random_flags(n: int, rate: float, seed=0) -> np.ndarray:
    """``n`` flags, each an overflow with probability ``rate``."""
    n = check_count("n", n)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be a probability in [0, 1], got {rate!r}")
    return _rng(seed).random(n) < rate


def bursts(n: int, count: int, max_length: int, seed=0) -> np.ndarray:
    """``n`` flags with ``count`` runs of 1..``max_length`` overflows at random places."""
    n, count = check_count("n", n), check_count("count", count)
    max_length = check_count("max_length", max_length, 1)
    rng = _rng(seed)
    flags = np.zeros(n, bool)
    for start in rng.integers(0, max(n, 1), count):
        flags[start:start + int(rng.integers(1, max_length + 1))] = True
    return flags


def clean_runs(growth_interval: int, runs: int = 3) -> np.ndarray:
    """An overflow, then for each of ``runs`` rounds clean runs of ``interval - 1``,
    ``interval``, ``interval + 1`` and ``2 * interval + 1`` steps, each ended by an overflow
    (lengths below 1 are dropped)."""
    interval = check_count("growth_interval", growth_interval, 1)
    runs = check_count("runs", runs)
    flags = [False, False, True]
    for _ in range(runs):
        for length in (interval - 1, interval, interval + 1, 2 * interval + 1):
            if length >= 1:
                flags += [False] * length + [True]
    return np.array(flags, bool)


def steps_to_collapse(reference, limit: int = 100_000, **overrides) -> int:
    """Consecutive overflows until the reference's scale stops changing (reaches 0, its
    floor, or raises at its minimum); at most ``limit``."""
    state, _ = reference_state(reference, overrides)
    for step in range(limit):
        try:
            after = state.update(True)
        except LossScaleMinimumError:
            return step
        if _same(after.scale, state.scale) and not after.decision.hysteresis_absorbed:
            return step
        state = after
    return limit


def steps_to_limit(reference, limit: int = 1_000_000, **overrides) -> int:
    """Clean steps until the reference's scale stops growing (a growth falls due and leaves
    the scale where it was: the finite guard, a ceiling, or inf); at most ``limit``."""
    state, _ = reference_state(reference, overrides)
    for step in range(limit):
        after = state.update(False)
        due = after.decision.grew or after.decision.growth_blocked is not None
        if due and (_same(after.scale, state.scale) or math.isinf(after.scale)):
            return step + 1
        state = after
    return limit


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def collapse(reference, tail: int = 50, **overrides) -> np.ndarray:
    """Overflows every step until the scale collapses (``steps_to_collapse``), then one more
    overflow and ``tail - 1`` clean steps."""
    steps = steps_to_collapse(reference, **overrides)
    tail = check_count("tail", tail, 1)
    return np.concatenate([np.ones(steps + 1, bool), np.zeros(tail - 1, bool)])


def growth_to_limit(reference, extra: int | None = None, **overrides) -> np.ndarray:
    """Clean steps until the scale stops growing plus ``extra`` (default: two growth
    intervals) more, then an overflow and one more interval of clean steps."""
    state, _ = reference_state(reference, overrides)
    interval = getattr(state.scaler, "growth_interval", 1)
    extra = 2 * interval if extra is None else check_count("extra", extra)
    steps = steps_to_limit(reference, **overrides)
    return np.concatenate([np.zeros(steps + extra, bool), [True], np.zeros(interval, bool)])


def standard_patterns(reference, seed: int = 0, **overrides) -> list[tuple[str, np.ndarray]]:
    """A named set of patterns for one reference configuration: random at four rates,
    bursts, clean runs around the growth interval, collapse, growth to the limit, and a
    grow/back-off see-saw. Keep ``growth_interval`` small (<= ~50) for short patterns."""
    state, _ = reference_state(reference, overrides)
    interval = getattr(state.scaler, "growth_interval", 1)
    rng = np.random.default_rng(seed)
    n = max(20 * interval, 500)
    out = [(f"random p={rate}", random_flags(n, rate, rng)) for rate in (0.001, 0.02, 0.3, 0.9)]
    out.append(("bursts", bursts(n, max(n // 100, 1), 30, rng)))
    out.append((f"clean runs around interval {interval}", clean_runs(interval)))
    out.append(("collapse", collapse(reference, **overrides)))
    out.append(("growth to the limit", growth_to_limit(reference, **overrides)))
    see_saw = np.tile(np.r_[np.zeros(interval, bool), True], max(n // (interval + 1), 1))
    out.append(("grow/back-off see-saw", see_saw))
    return out
