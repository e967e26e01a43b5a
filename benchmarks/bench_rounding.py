"""Rounding throughput on gradient-like data, as ratios against baselines timed in the same run.

Data: 4M float32 values N(0,1) * 2**k, k uniform in [-30, 18), seed 0: many subnormals,
underflows and overflows, like real gradients. Each format is rounded with nearest_even by
``fpsim.round_to`` and by the library cast that does the same job (numpy's float16 round trip,
ml_dtypes' casts), and every one of our values is checked against that cast: ``wrong`` must be 0.

    python benchmarks/bench_rounding.py [--n 4194304] [--repeat 7]

Targets (2 cores): fp16 >= 10x numpy's float16 cast; bf16 and fp8 >= 1x ml_dtypes' casts.
"""
from __future__ import annotations

import argparse
import warnings

import ml_dtypes
import numpy as np

from _timing import best_seconds
from fpsim import round_to

CASES = [  # (fpsim format, oracle dtype, oracle name, target ratio)
    ("fp16", np.float16, "numpy float16", 10.0),
    ("bf16", ml_dtypes.bfloat16, "ml_dtypes bfloat16", 1.0),
    ("e4m3fn", ml_dtypes.float8_e4m3fn, "ml_dtypes float8_e4m3fn", 1.0),
    ("e5m2", ml_dtypes.float8_e5m2, "ml_dtypes float8_e5m2", 1.0),
]


def gradient_like(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-30, 18, n))).astype(np.float32)




def count_wrong(ours: np.ndarray, reference: np.ndarray) -> int:
    same = (ours.view(np.uint32) == reference.view(np.uint32)) | (
        np.isnan(ours) & np.isnan(reference))
    return int(np.count_nonzero(~same))


def run(n: int, repeat: int) -> list[dict]:
    x = gradient_like(n)
    rows = []
    copy_s = best_seconds(lambda: x.copy(), repeat)
    rows.append(dict(case="copy (ceiling)", melems=n / copy_s / 1e6))
    for fmt, dtype, oracle, target in CASES:
        def cast(dtype=dtype):
            return x.astype(dtype).astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the casts warn on overflow
            oracle_s = best_seconds(cast, repeat)
            reference = cast()
        ours_s = best_seconds(lambda fmt=fmt: round_to(x, fmt), repeat)
        wrong = count_wrong(round_to(x, fmt), reference)
        rows.append(dict(case=f"{fmt} vs {oracle}", melems=n / ours_s / 1e6,
                         oracle_melems=n / oracle_s / 1e6, ratio=oracle_s / ours_s,
                         target=target, wrong=wrong))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = run(args.n, args.repeat)
    print(f"{args.n} float32 values N(0,1)*2^k, k in [-30,18), seed 0; best of {args.repeat}")
    print(f"{'case':34} {'fpsim Melem/s':>14} {'baseline Melem/s':>17} {'ratio':>7} "
          f"{'target':>7} {'wrong':>6}")
    for row in rows:
        if "ratio" not in row:
            print(f"{row['case']:34} {row['melems']:14.0f}")
            continue
        verdict = "ok" if row["ratio"] >= row["target"] and row["wrong"] == 0 else "MISS"
        print(f"{row['case']:34} {row['melems']:14.0f} {row['oracle_melems']:17.0f} "
              f"{row['ratio']:6.1f}x {row['target']:6.1f}x {row['wrong']:6d}  {verdict}")


if __name__ == "__main__":
    main()
