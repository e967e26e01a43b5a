"""Hypothesis strategies for overflow patterns (lists of ``found_inf`` booleans).

Needs hypothesis (a test-only dependency: ``pip install hypothesis``). Property-test your
own scaler against a preset in a few lines::

    from hypothesis import given, settings
    from fpsim.conformance import compare
    from fpsim.conformance.strategies import overflow_patterns

    @settings(max_examples=200, deadline=None)
    @given(overflow_patterns(growth_interval=4))
    def test_my_scaler_behaves_like_torch(flags):
        report = compare(MyScalerAdapter(growth_interval=4), flags, "torch", growth_interval=4)
        assert report.agree, report

The shapes (each also on its own):

``random_flags``     independent overflows at a drawn rate
``bursts``           runs of consecutive overflows between clean stretches
``clean_runs``       clean runs of ``interval - 1 .. interval + 1`` and multiples, each ended
                     by an overflow (where growth off-by-ones show)
``collapses``        an overflow every step until the scale has collapsed, then clean steps
``growth_to_limit``  clean steps until the scale has stopped growing at its limit (float32's
                     2**127 with torch), then an overflow and more clean steps

``collapses`` and ``growth_to_limit`` take the reference (a preset name, with overrides, or
a scaler) to know how many steps collapse or growth take.
"""
from __future__ import annotations

try:
    from hypothesis import strategies as st
except ImportError as err:  # pragma: no cover - exercised only without hypothesis
    raise ImportError("fpsim.conformance.strategies needs hypothesis: pip install hypothesis "
                      "(or pip install 'fpsim[test]')") from err

from .patterns import steps_to_collapse, steps_to_limit
from .replay import reference_state

__all__ = ["random_flags", "bursts", "clean_runs", "collapses", "growth_to_limit",
           "overflow_patterns"]


def random_flags(max_size: int = 300):
    """Lists of 1 to ``max_size`` flags (an empty run compares nothing), overflows at a rate
    drawn from [0, 1]."""
    @st.composite
    def build(draw):
        rate = draw(st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0]))
        size = draw(st.integers(1, max(max_size, 1)))
        if rate in (0.0, 1.0):
            return [rate == 1.0] * size
        return draw(st.lists(st.floats(0, 1), min_size=size, max_size=size).map(
            lambda us: [u < rate for u in us]))
    return build()


def bursts(max_bursts: int = 8, max_burst: int = 40, max_gap: int = 200):
    """Alternating clean gaps (0..``max_gap``) and overflow bursts (1..``max_burst``)."""
    pair = st.tuples(st.integers(0, max_gap), st.integers(1, max_burst))
    return st.lists(pair, min_size=1, max_size=max_bursts).map(
        lambda pairs: [f for gap, burst in pairs for f in [False] * gap + [True] * burst])


def clean_runs(growth_interval: int, max_runs: int = 8):
    """Clean runs of length ``interval + d`` (d in -1..1) or ``k * interval + d``, each ended
    by an overflow."""
    if growth_interval < 1:
        raise ValueError(f"growth_interval must be >= 1, got {growth_interval!r}")
    run = st.tuples(st.integers(1, 3), st.integers(-1, 1)).map(
        lambda kd: max(kd[0] * growth_interval + kd[1], 0))
    return st.lists(run, min_size=1, max_size=max_runs).map(
        lambda runs: [f for n in runs for f in [False] * n + [True]])


def collapses(reference="torch", max_tail: int = 50, **overrides):
    """An overflow every step until the reference's scale has collapsed (0, its floor, or
    its error at the minimum), maybe a few more, then up to ``max_tail`` clean steps."""
    steps = steps_to_collapse(reference, **overrides)
    return st.tuples(st.integers(0, 3), st.integers(0, max_tail)).map(
        lambda extra_tail: [True] * (steps + extra_tail[0]) + [False] * extra_tail[1])


def growth_to_limit(reference="torch", **overrides):
    """Clean steps until the reference's scale stops growing, then 0..2 intervals more, an
    overflow, and up to two intervals of clean steps (growth resumes from below the top)."""
    steps = steps_to_limit(reference, **overrides)
    state, _ = reference_state(reference, overrides)
    interval = getattr(state.scaler, "growth_interval", 1)
    return st.tuples(st.integers(0, 2 * interval), st.integers(0, 2 * interval)).map(
        lambda more: [False] * (steps + more[0]) + [True] + [False] * more[1])


def overflow_patterns(reference="torch", *, growth_interval: int | None = None,
                      max_size: int = 300, **overrides):
    """Any of the shapes above, for ``reference`` (a preset name or scaler) with
    ``growth_interval`` (and any other overrides) applied. Keep the interval small (<= ~20)
    so growth to the limit stays a few thousand steps."""
    if growth_interval is not None:
        overrides["growth_interval"] = growth_interval
    state, _ = reference_state(reference, overrides)
    interval = getattr(state.scaler, "growth_interval", 1)
    return st.one_of(random_flags(max_size), bursts(), clean_runs(interval),
                     collapses(reference, **overrides), growth_to_limit(reference, **overrides))
