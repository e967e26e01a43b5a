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
