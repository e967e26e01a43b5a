"""Rounding throughput on gradient-like data, as ratios against baselines timed in the same run.

Data: 4M float32 values N(0,1) * 2**k, k uniform in [-30, 18), seed 0: many subnormals,
underflows and overflows, like real gradients. Each format is rounded with nearest_even by
``fpsim.round_to`` and by the library cast that does the same job (numpy's float16 round trip,
ml_dtypes' casts), and every one of our values is checked against that cast: ``wrong`` must be 0.

    python benchmarks/bench_rounding.py [--n 4194304] [--repeat 7]

Targets (2 cores): fp16 >= 10x numpy's float16 cast; bf16 and fp8 >= 1x ml_dtypes' casts;
e4m3fn >= 0.9x e5m2 (both ours, nearest even); stochastic fp16 >= 0.5x nearest-even fp16;
fp16 >= 0.5x a plain copy. Each row runs on the kernels ``round_to`` chooses (the compiled
loops where Numba is installed) and again on the NumPy kernels alone (``numpy kernels``), so
the table shows what the optional ``fpsim[fast]`` buys.
"""
from __future__ import annotations

import argparse
import warnings

import ml_dtypes
import numpy as np

from _timing import best_seconds
from fpsim import round_to
from fpsim.rounding import use_compiled
from fpsim.rounding.compiled import available as compiled_available

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
    copy_s = best_seconds(lambda: x.copy(), repeat)
    rows = [dict(case="copy (ceiling)", melems=n / copy_s / 1e6)]
    for label, compiled in kernel_choices():
        use_compiled(compiled)
        rows += library_rows(x, repeat, label) + ratio_rows(x, repeat, label, copy_s)
    return rows


def kernel_choices() -> list[tuple[str, bool]]:
    if compiled_available():
        return [("", True), (" [numpy kernels]", False)]
    return [(" [numpy kernels; Numba not installed]", False)]


def library_rows(x: np.ndarray, repeat: int, label: str) -> list[dict]:
    """Each format against the library cast that does the same job; every value checked."""
    rows = []
    for fmt, dtype, oracle, target in CASES:
        def cast(dtype=dtype):
            return x.astype(dtype).astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the casts warn on overflow
            oracle_s = best_seconds(cast, repeat)
            reference = cast()
        ours_s = best_seconds(lambda fmt=fmt: round_to(x, fmt), repeat)
        wrong = count_wrong(round_to(x, fmt), reference)
        rows.append(dict(case=f"{fmt} vs {oracle}{label}", melems=x.size / ours_s / 1e6,
                         oracle_melems=x.size / oracle_s / 1e6, ratio=oracle_s / ours_s,
                         target=target, wrong=wrong))
    return rows


def ratio_rows(x: np.ndarray, repeat: int, label: str, copy_s: float) -> list[dict]:
    """Our own kernels against each other (and fp16 against a copy): e4m3fn's NaN rule,
    stochastic rounding's Philox draw. ``wrong`` is not counted here (the library rows and
    the tests check the values)."""
    def seconds(fmt, mode="nearest_even"):
        options = {"seed": 0} if mode == "stochastic" else {}
        return best_seconds(lambda: round_to(x, fmt, mode, **options), repeat)

    fp16_s = seconds("fp16")
    rows = []
    for case, ours_s, base_s, base, target in (
            ("e4m3fn vs e5m2", seconds("e4m3fn"), seconds("e5m2"), "e5m2", 0.9),
            ("fp16 stochastic vs fp16 nearest", seconds("fp16", "stochastic"), fp16_s,
             "fp16 nearest", 0.5),
            ("fp16 nearest vs copy", fp16_s, copy_s, "copy", 0.5)):
        rows.append(dict(case=case + label, melems=x.size / ours_s / 1e6,
                         oracle_melems=x.size / base_s / 1e6, ratio=base_s / ours_s,
                         target=target, wrong=0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = run(args.n, args.repeat)
    print(f"{args.n} float32 values N(0,1)*2^k, k in [-30,18), seed 0; best of {args.repeat}")
    print(f"{'case':56} {'fpsim Melem/s':>14} {'baseline Melem/s':>17} {'ratio':>7} "
          f"{'target':>7} {'wrong':>6}")
    for row in rows:
        if "ratio" not in row:
            print(f"{row['case']:56} {row['melems']:14.0f}")
            continue
        verdict = "ok" if row["ratio"] >= row["target"] and row["wrong"] == 0 else "MISS"
        print(f"{row['case']:56} {row['melems']:14.0f} {row['oracle_melems']:17.0f} "
              f"{row['ratio']:6.1f}x {row['target']:6.1f}x {row['wrong']:6d}  {verdict}")


if __name__ == "__main__":
    main()
