"""Correct rounding, exhaustively where it can be: every finite value of fp16, bf16 and the
four FP8 formats through exp, log, tanh, sigmoid and gelu, and every pair of finite e4m3fn
and of e5m2 values as a 2-class softmax, log-softmax and cross-entropy row, into fp32, fp16,
bf16, e4m3fn and e5m2, against MPFR (400 bits); then the Decimal fallback forced on for every
FP8 input (``forced_fallback``), where it must give the same bits as MPFR too.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

gmpy2 = pytest.importorskip("gmpy2")

import fpsim.exact as fx  # noqa: E402
from fpsim.encoding import decode  # noqa: E402
from fpsim.formats import get  # noqa: E402
from fpsim.rounding import round_to  # noqa: E402
from mpfr_oracle import (function_values, log_softmax_values, mpfr_rounded,  # noqa: E402
                         softmax_values)

SIXTEEN = ("fp16", "bf16")
FP8 = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
OUTPUTS = ("fp32", "fp16", "bf16", "e4m3fn", "e5m2")
CR = {"exp": fx.cr_exp, "log": fx.cr_log, "tanh": fx.cr_tanh, "sigmoid": fx.cr_sigmoid,
      "gelu": fx.cr_gelu}


def every_value(fmt: str) -> np.ndarray:
    """Every finite value of ``fmt`` (each bit pattern decoded; -0 included), as float32."""
    f = get(fmt)
    values = decode(np.arange(1 << f.bits, dtype=np.uint32).astype(f.bit_dtype), f)
    return values[np.isfinite(values)]


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct float32 values, by bit pattern (so -0 stays beside +0)."""
    return np.unique(values.view(np.uint32)).view(np.float32)


@lru_cache(maxsize=None)
def inputs(formats: tuple[str, ...], name: str) -> np.ndarray:
    x = distinct(np.concatenate([every_value(f) for f in formats]))
    return x[~np.signbit(x) | (x == 0)] if name == "log" else x   # log < 0: test_special_values


@lru_cache(maxsize=None)
def exact(formats: tuple[str, ...], name: str):
    return function_values(name, inputs(formats, name), 400)


def _check(name, formats, fmt, what):
    x = inputs(formats, name)
    got = round_to(CR[name](x, get(fmt)), get(fmt)).astype(np.float32)
    want = mpfr_rounded(exact(formats, name), fmt)
    wrong = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert wrong.size == 0, (f"{what}: {name} -> {fmt}: {wrong.size} of {x.size} differ at "
                             f"x = {x[wrong[:4]].tolist()}: got {got[wrong[:4]]}, "
                             f"want {want[wrong[:4]]}")


@pytest.mark.parametrize("name", sorted(CR))
def test_every_16_and_8_bit_input(name):
    x = inputs(SIXTEEN + FP8, name)
    assert x.size > 120_000 if name != "log" else x.size > 60_000
    for fmt in OUTPUTS:
        _check(name, SIXTEEN + FP8, fmt, "every fp16/bf16/fp8 value")


@pytest.mark.parametrize("name", sorted(CR))
def test_every_fp8_input_through_the_forced_fallback(name):
    x = inputs(FP8, name)
    before = fx.FALLBACK_COUNT["elements"]
    with fx.forced_fallback():
        for fmt in OUTPUTS:
            _check(name, FP8, fmt, "forced fallback")
    # all but the values the switch leaves to the float64 path (zeros, far ones, bound 0)
    assert fx.FALLBACK_COUNT["elements"] - before >= len(OUTPUTS) * x.size // 2


def fp8_pairs(fmt: str) -> np.ndarray:
    """Every ordered pair of finite ``fmt`` values, distinct by value (no -0 twin), as rows."""
    v = np.unique(every_value(fmt).astype(np.float64)).astype(np.float32)
    return np.stack(np.meshgrid(v, v, indexing="ij"), -1).reshape(-1, 2)


@lru_cache(maxsize=None)
def pair_oracle(fmt: str):
    """(rows, softmax, log-softmax) of every pair, the two exact as flat lists of mpfr."""
    rows = fp8_pairs(fmt)
    return rows, softmax_values(rows), log_softmax_values(rows)


def _same(got, want, what):
    got = np.asarray(got, np.float32).ravel()
    wrong = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert wrong.size == 0, f"{what}: {wrong.size} differ: {got[wrong[:4]]} vs {want[wrong[:4]]}"


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_every_fp8_pair_as_a_row(fmt):
    rows, soft, logs = pair_oracle(fmt)
    labels = np.arange(rows.shape[0]) % 2
    for out in OUTPUTS:
        f = get(out)
        want_log = mpfr_rounded(logs, out)
        _same(round_to(fx.cr_softmax(rows, 1, f), f), mpfr_rounded(soft, out),
              f"softmax {fmt} -> {out}")
        _same(round_to(fx.cr_log_softmax(rows, 1, f), f), want_log,
              f"log_softmax {fmt} -> {out}")
        loss = -want_log.reshape(rows.shape)[np.arange(rows.shape[0]), labels]
        _same(round_to(fx.cr_cross_entropy(rows, labels, "none", f), f), loss,
              f"cross_entropy {fmt} -> {out}")


def test_fp8_pairs_through_the_forced_fallback():
    rows, soft, logs = pair_oracle("e4m3fn")
    pick = np.arange(0, rows.shape[0], 61)
    soft = [soft[2 * i + j] for i in pick for j in (0, 1)]
    logs = [logs[2 * i + j] for i in pick for j in (0, 1)]
    rows = rows[pick]
    before = fx.FALLBACK_COUNT["elements"]
    with fx.forced_fallback():
        for out in ("fp32", "bf16", "e4m3fn"):
            f = get(out)
            _same(round_to(fx.cr_softmax(rows, 1, f), f), mpfr_rounded(soft, out),
                  f"forced softmax -> {out}")
            _same(round_to(fx.cr_log_softmax(rows, 1, f), f), mpfr_rounded(logs, out),
                  f"forced log_softmax -> {out}")
    assert fx.FALLBACK_COUNT["elements"] - before >= 3 * rows.size
