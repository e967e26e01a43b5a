"""Timing shared by the benchmark scripts (run them as ``python benchmarks/<name>.py``)."""
from __future__ import annotations

import time


def best_seconds(fn, repeat: int) -> float:
    """The fastest of ``repeat`` timed calls, after one untimed warm-up call (page in
    buffers, start threads)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def seconds_per_call(fn, repeat: int, budget_s: float, synchronize=lambda: None) -> float:
    """Seconds per call of ``fn``: the fastest of ``repeat`` rounds of about
    ``budget_s / repeat`` seconds each, after two warm-up calls; ``synchronize`` runs before
    each clock reading (a GPU's queue drained)."""
    fn()
    fn()
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    calls = max(1, int(budget_s / repeat / max(time.perf_counter() - start, 1e-7)))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
    return best
