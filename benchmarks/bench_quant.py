"""Block-scaled quantization throughput (``fpsim.quant.blocks``), as ratios against baselines
timed in the same run.

Data: 4M float32 values N(0,1) * 2**k, k uniform in [-30, 18), seed 0, as a (1024, 4096)
matrix (blocks along the rows). Each quantization (amax, scale, cast, counts) is timed
against the cast alone (``round_to(x, fmt, saturate=True)``, the floor of any scaled cast)
and, where torchao is installed, against its MX reference ``to_mx`` on the CPU (eager
PyTorch). Every MX result's scale codes are checked against torchao's: ``wrong`` counts the
blocks where they differ (0 expected: this data has none of the NaN or code-0 blocks where
the two differ by design, see ``fpsim.quant.blocks``).

    python benchmarks/bench_quant.py [--n 4194304] [--repeat 7]

Target (2 cores): MX quantization of 4M float32 values >= 100 Melem/s.
"""
from __future__ import annotations

import argparse

import numpy as np

from _timing import best_seconds
from fpsim import round_to
from fpsim.quant.blocks import ScaleRule, mx_quantize, tile_quantize

TARGET_MELEMS = 100.0


def gradient_like(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n) * np.exp2(rng.integers(-30, 18, n))
    return values.astype(np.float32).reshape(-1, 4096)


def torchao_to_mx():
    """torchao's ``to_mx`` and its modes, or None when torchao is not installed."""
    try:
        import torch
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
    except ImportError:
        return None
    dtypes = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    modes = {ScaleRule.SPEC: ScaleCalculationMode.FLOOR, ScaleRule.RCEIL: ScaleCalculationMode.RCEIL}

    def quantize(x, fmt, rule):
        codes, elements = to_mx(torch.from_numpy(x), dtypes[fmt], 32, modes[rule])
        return codes.view(torch.uint8).numpy()
    return quantize


def run(n: int, repeat: int) -> list[dict]:
    x = gradient_like(n)
    size = x.size
    torchao = torchao_to_mx()
    rows = [dict(case="copy (ceiling)", melems=size / best_seconds(x.copy, repeat) / 1e6)]
    for fmt in ("e4m3fn", "e5m2"):
        cast_s = best_seconds(lambda fmt=fmt: round_to(x, fmt, saturate=True), repeat)
        rows.append(dict(case=f"cast alone {fmt}", melems=size / cast_s / 1e6))
        for rule in ScaleRule:
            ours_s = best_seconds(lambda fmt=fmt, rule=rule: mx_quantize(x, fmt, scale_rule=rule),
                                  repeat)
            row = dict(case=f"MX {fmt} {rule.value}", melems=size / ours_s / 1e6,
                       cast_ratio=cast_s / ours_s, target=TARGET_MELEMS)
            if torchao is not None:
                theirs_s = best_seconds(lambda fmt=fmt, rule=rule: torchao(x, fmt, rule), repeat)
                ours = np.asarray(mx_quantize(x, fmt, scale_rule=rule).scale_codes)
                row.update(torchao_melems=size / theirs_s / 1e6, torchao_ratio=theirs_s / ours_s,
                           wrong=int(np.count_nonzero(ours != torchao(x, fmt, rule))))
            rows.append(row)
        for tile in ((1, 128), (128, 128)):
            ours_s = best_seconds(lambda fmt=fmt, tile=tile: tile_quantize(x, fmt, tile), repeat)
            rows.append(dict(case=f"tiles {tile[0]}x{tile[1]} {fmt}", melems=size / ours_s / 1e6,
                             cast_ratio=cast_s / ours_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 22)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = run(args.n, args.repeat)
    print(f"{args.n} float32 values N(0,1)*2^k, k in [-30,18), seed 0, rows of 4096; "
          f"best of {args.repeat}")
    print(f"{'case':24} {'Melem/s':>8} {'vs cast':>8} {'torchao Melem/s':>16} {'vs torchao':>11} "
          f"{'wrong':>6}")
    for row in rows:
        line = f"{row['case']:24} {row['melems']:8.0f}"
        if "cast_ratio" in row:
            line += f" {row['cast_ratio']:7.2f}x"
        if "torchao_melems" in row:
            line += f" {row['torchao_melems']:16.0f} {row['torchao_ratio']:10.1f}x {row['wrong']:6d}"
        if "target" in row:
            ok = row["melems"] >= row["target"] and row.get("wrong", 0) == 0
            line += "  ok" if ok else f"  MISS (target {row['target']:.0f} Melem/s)"
        print(line)


if __name__ == "__main__":
    main()
