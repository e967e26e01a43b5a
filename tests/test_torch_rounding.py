"""The torch backend's cast rounding (``fpsim/backend/torch_rounding.py``): float32 to fp16,
bf16 and e4m3fn by torch's own casts gives ``fpsim.rounding.round_to``'s bits, NaN payloads
and signed zeros included, for every high half of a float32 pattern with seven low halves,
every value, midpoint and quarter point of each format with their float32 neighbours
(``hard_cases``), and, marked slow, every one of the 2**32 float32 patterns. On the CPU, and
on CUDA where there is a device (marked ``gpu``; NaNs there compare as in
``test_torch_backend.same_bits``)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend needs PyTorch (fpsim[torch])")

from fpsim.backend.torch_backend import TorchBackend  # noqa: E402
from fpsim.backend.torch_rounding import cast_round  # noqa: E402
from fpsim.formats import get  # noqa: E402
from fpsim.rounding import round_to  # noqa: E402
from test_rounding_portable import HI16, hard_cases  # noqa: E402

FORMATS = ["fp16", "bf16", "e4m3fn"]
SATURATE = [None, True]
LOW_HALVES = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], np.uint32)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def ops(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False here")
    backend = TorchBackend(request.param)
    backend.activate()
    try:
        yield backend
    finally:
        TorchBackend("cpu").activate()


def same_bits(ops, expected: np.ndarray, got: np.ndarray) -> bool:
    return not differing(ops, expected, got).any()


def differing(ops, expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Where the bits differ (a NaN matches any NaN on CUDA, whose NaNs are canonical)."""
    assert got.dtype == np.float32 and got.shape == expected.shape
    differ = expected.view(np.uint32) != got.view(np.uint32)
    if ops.device.type == "cuda":
        differ &= ~(np.isnan(expected) & np.isnan(got))
    return differ


def mismatches(ops, x: np.ndarray, fmt: str, **options) -> int:
    """How many of ``x``'s roundings by the backend differ in their bits from round_to's."""
    with np.errstate(all="ignore"):
        expected = round_to(x, fmt, **options)
    got = ops.to_numpy(ops.round_to(ops.asarray(x, torch.float32), fmt, **options))
    return int(np.count_nonzero(differing(ops, expected, got)))


def every_high_half() -> np.ndarray:
    """Each of the 2**16 high halves of a float32 with seven low halves (the rounding
    boundaries of fp16 and bf16 sit in the low half): every exponent, both signs, inf, NaNs."""
    high = HI16.view(np.uint32)[:, None]
    return (high | LOW_HALVES[None, :]).ravel().view(np.float32)


@pytest.mark.parametrize("saturate", SATURATE)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_cast_gives_round_tos_bits(ops, fmt, saturate):
    cases = np.concatenate([every_high_half(), hard_cases(get(fmt))[0]])
    assert cast_round(ops, ops.asarray(cases), get(fmt), "nearest_even", subnormals=None,
                      saturate=saturate, daz=False) is not None      # the cast path ran
    assert mismatches(ops, cases, fmt, saturate=saturate) == 0
    # the GPU's choice, NaNs settled without looking first, on this device too
    with np.errstate(all="ignore"):
        expected = round_to(cases, fmt, saturate=saturate)
    settled = cast_round(ops, ops.asarray(cases), get(fmt), "nearest_even", subnormals=None,
                         saturate=saturate, daz=False, look_for_nans=False)
    assert same_bits(ops, expected, ops.to_numpy(settled))


@pytest.mark.parametrize("mode,flags", [("toward_zero", {}), ("nearest_away", {}),
                                        ("nearest_even", {"subnormals": False}),
                                        ("nearest_even", {"daz": True})])
def test_what_the_cast_cannot_do_goes_the_portable_way(ops, mode, flags):
    x = np.concatenate([every_high_half()[::7], hard_cases(get("fp16"))[0]])
    options = {"subnormals": None, "saturate": None, "daz": False, **flags}
    assert cast_round(ops, ops.asarray(x), get("fp16"), mode, **options) is None
    assert mismatches(ops, x, "fp16", mode=mode, **flags) == 0
    assert mismatches(ops, x, "bf16", mode="stochastic", seed=3, offset=2**40) == 0
    plain = {"subnormals": None, "saturate": None, "daz": False}
    assert cast_round(ops, ops.asarray(x).double(), get("fp16"), "nearest_even",
                      **plain) is None                                   # float64 in
    assert cast_round(ops, ops.asarray(x), get("e5m2"), "nearest_even", **plain) is None


def test_the_three_formats_overflow_as_their_rules_say(ops):
    bf16_tie = np.float32(2.0 ** 127 * (2 - 2.0 ** -8))    # between bf16's max and 2**128
    x = np.float32([65519.99, 65520.0, 464.0, 464.00003, 480.0, np.inf, -np.inf, -500.0,
                    np.nextafter(bf16_tie, np.float32(0)), bf16_tie])
    expected = {"fp16": [65504.0, np.inf, 464.0, 464.0, 480.0, np.inf, -np.inf, -500.0,
                         np.inf, np.inf],
                "e4m3fn": [np.nan, np.nan, 448.0, np.nan, np.nan, np.nan, np.nan, np.nan,
                           np.nan, np.nan]}
    for fmt, values in expected.items():
        got = ops.to_numpy(ops.round_to(ops.asarray(x), fmt))
        np.testing.assert_array_equal(got, np.float32(values))
    assert ops.to_numpy(ops.round_to(ops.asarray(x), "bf16"))[-2:].tolist() == [
        float(get("bf16").max_finite), float("inf")]    # the tie goes to even: 2**128, inf
    saturated = ops.to_numpy(ops.round_to(ops.asarray(x), "e4m3fn", saturate=True))
    np.testing.assert_array_equal(saturated, np.float32([448] * 6 + [-448] * 2 + [448] * 2))


@pytest.mark.slow
@pytest.mark.parametrize("saturate", SATURATE)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_float32(ops, fmt, saturate):
    """All 2**32 float32 patterns, 2**24 at a time (about 30 s a format on 2 CPU cores)."""
    step = np.uint64(1 << 24)
    for start in range(0, 1 << 32, 1 << 24):
        x = np.arange(np.uint64(start), np.uint64(start) + step, dtype=np.uint64)
        assert mismatches(ops, x.astype(np.uint32).view(np.float32), fmt,
                          saturate=saturate) == 0, hex(start)
