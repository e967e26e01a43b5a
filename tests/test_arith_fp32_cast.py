"""``Arith("fp32").round`` of float64 values takes NumPy's float64 -> float32 cast when no NaN
is present: the same bits as ``round_to(x, FP32)`` on ties, subnormals, overflow and zeros."""
from __future__ import annotations

import numpy as np

from fpsim import backend
from fpsim.formats import FP32
from fpsim.optim.arith import Arith
from fpsim.rounding import round_to


def hard_float64_values(rng) -> np.ndarray:
    f32 = rng.standard_normal(20000).astype(np.float32) * np.float32(2.0) ** rng.integers(
        -149, 127, 20000).astype(np.float32)
    f32 = f32[np.isfinite(f32)]
    up = np.nextafter(f32, np.float32(np.inf)).astype(np.float64)
    ties = (f32.astype(np.float64) + up) / 2                    # exact midpoints (even/odd)
    near = np.concatenate([np.nextafter(ties, -np.inf), np.nextafter(ties, np.inf)])
    top = float(np.finfo(np.float32).max)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, top, top * (1 + 2.0 ** -25),
                      top * (1 + 2.0 ** -24), 2.0 ** -150, -(2.0 ** -150), 2.0 ** -149 * 1.5,
                      2.0 ** -151, 1e-300, -1e300])
    wide = rng.standard_normal(20000) * 2.0 ** rng.integers(-160, 130, 20000)
    return np.concatenate([ties, near, edges, wide])


def test_fp32_round_of_float64_is_round_to():
    x = hard_float64_values(np.random.default_rng(3))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = round_to(x, FP32).astype(np.float32)
    got = Arith("fp32").round(backend.asarray(x, backend.xp.float64))
    assert got.dtype == backend.xp.float32
    got = backend.to_numpy(got)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_fp32_round_with_nans_keeps_round_to_payloads():
    nan_bits = np.array([0x7FF8000000000001, 0xFFF4000000000000, 0x7FF0000000000001],
                        np.uint64)
    x = np.concatenate([nan_bits.view(np.float64), [1.0, 2.0 ** -150]])
    with np.errstate(over="ignore", invalid="ignore"):
        expected = round_to(x, FP32).astype(np.float32)
    got = backend.to_numpy(Arith("fp32").round(backend.asarray(x, backend.xp.float64)))
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
