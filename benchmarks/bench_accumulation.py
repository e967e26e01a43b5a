"""Exact-model matmul: certified float64 fast path vs plain float32 numpy vs forced fallback.

Timed in the same run, reported as ratios to ``numpy.matmul`` on float32 (the baseline), at
the two shapes of an MLP training step (M x K x N = 128x256x256 and 256x784x1024). Data:
bf16-rounded N(0,1) activations times N(0,1)/sqrt(K) weights, seed 0. Also printed: the
fraction of elements the fast path could not certify (they take the exact fallback), and a
check that the fast path and the forced fallback agree bit for bit (``same`` must be True).

    python benchmarks/bench_accumulation.py [--repeat 3] [--skip-forced]

The forced fallback (integer limbs for every element) is the slow reference, timed once; so
are the sequential and blocked models at the small shape (their loops run over K).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from _timing import best_seconds
from fpsim.exact.exact_dots import exact_matmul
from fpsim.exact.accumulation import matmul
from fpsim.formats import FP32
from fpsim.rounding import round_to

SHAPES = [(128, 256, 256), (256, 784, 1024)]




def data(m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = round_to(rng.standard_normal((m, k)).astype(np.float32), "bf16")
    b = round_to((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "bf16")
    return a, b


def run(repeat: int, forced: bool) -> None:
    print(f"{'M x K x N':>16} {'f32 numpy ms':>13} {'exact ms':>9} {'ratio':>7} "
          f"{'fallback frac':>14} {'forced ms':>10} {'ratio':>8} {'same':>5}")
    for m, k, n in SHAPES:
        a, b = data(m, k, n)
        base = best_seconds(lambda: np.matmul(a, b), repeat)
        fast = best_seconds(lambda: matmul(a, b, out_fmt="bf16"), repeat)
        fast_bits, fallbacks = exact_matmul(a[None], b[None], FP32)
        line = (f"{m:>4}x{k:>4}x{n:>4}  {base * 1e3:>13.2f} {fast * 1e3:>9.2f} "
                f"{fast / base:>6.1f}x {fallbacks / fast_bits.size:>14.2e}")
        if forced:
            start = time.perf_counter()
            slow_bits, _ = exact_matmul(a[None], b[None], FP32, force_fallback=True)
            slow = time.perf_counter() - start
            same = bool(np.array_equal(fast_bits.view(np.uint64), slow_bits.view(np.uint64)))
            line += f" {slow * 1e3:>10.0f} {slow / base:>7.0f}x {same!s:>5}"
        print(line)


def run_models(repeat: int) -> None:
    m, k, n = SHAPES[0]
    a, b = data(m, k, n)
    base = best_seconds(lambda: np.matmul(a, b), repeat)
    print(f"\nslow models at {m}x{k}x{n} (loops over K), vs float32 numpy:")
    for model in ("sequential:fp32", "sequential:fp16", "blocked:4:fp32", "v100", "h100"):
        seconds = best_seconds(lambda: matmul(a, b, out_fmt="fp32", model=model), 1)
        print(f"{model:>16} {seconds * 1e3:>9.1f} ms {seconds / base:>9.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-forced", action="store_true",
                        help="do not time the forced exact fallback (slow)")
    args = parser.parse_args()
    run(args.repeat, not args.skip_forced)
    run_models(args.repeat)


if __name__ == "__main__":
    main()
