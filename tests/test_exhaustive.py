"""Every bit pattern of the 16- and 8-bit formats, and dense sweeps of every rounding
boundary, against numpy.float16 and ml_dtypes (oracles we did not write)."""
import ml_dtypes
import numpy as np
import pytest

from fpsim import round_to
from fpsim.encoding import decode, encode
from fpsim.formats import BF16, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, FP16, custom
from fpsim.rounding import MODES

ORACLE_DTYPES = [
    (FP16, np.float16), (BF16, ml_dtypes.bfloat16), (E4M3FN, ml_dtypes.float8_e4m3fn),
    (E5M2, ml_dtypes.float8_e5m2), (E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
    (E5M2FNUZ, ml_dtypes.float8_e5m2fnuz), (custom(4, 3), ml_dtypes.float8_e4m3),
    (custom(3, 4), ml_dtypes.float8_e3m4),
]
IDS = [fmt.name for fmt, _ in ORACLE_DTYPES]


def same_bits(a, b):
    """Bitwise equality, with any NaN equal to any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    uint = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return (a.view(uint) == b.view(uint)) | (np.isnan(a) & np.isnan(b))


def all_patterns(fmt):
    return np.arange(1 << fmt.bits, dtype=fmt.bit_dtype)


@pytest.mark.parametrize("fmt,dtype", ORACLE_DTYPES, ids=IDS)
def test_every_pattern_decodes_like_the_oracle_and_reencodes_to_itself(fmt, dtype):
    bits = all_patterns(fmt)
    ours = decode(bits, fmt)
    theirs = bits.view(dtype).astype(np.float32)
    assert same_bits(ours, theirs).all()
    assert np.isnan(ours).sum() == np.isnan(theirs).sum()
    assert np.array_equal(encode(ours, fmt), bits)
    assert np.array_equal(encode(decode(bits, fmt, np.float64), fmt), bits)
    finite = np.isfinite(theirs)
    assert np.array_equal(encode(bits.view(dtype)[finite], fmt), bits[finite])


@pytest.mark.parametrize("fmt,dtype", ORACLE_DTYPES, ids=IDS)
@pytest.mark.parametrize("mode", [m for m in MODES if m != "stochastic"])
def test_every_representable_value_rounds_to_itself(fmt, dtype, mode):
    values = decode(all_patterns(fmt), fmt)
    for container in (np.float32, np.float64):
        with np.errstate(invalid="ignore"):  # signalling NaNs quieten when widened
            x = values.astype(container)
        assert same_bits(round_to(x, fmt, mode), x).all()


def sweep(fmt, extra_low=()):
    """float32 patterns around every rounding boundary of ``fmt``: each pattern of the top
    (1 + 8 + man_bits) bits combined with the interesting low bits (zero, one, just under,
    at and just over the half-way point, all ones)."""
    drop = 23 - fmt.man_bits
    half = 1 << (drop - 1)
    low = np.array([0, 1, half - 1, half, half + 1, (1 << drop) - 1, *extra_low], np.uint32)
    high = np.arange(1 << (9 + fmt.man_bits), dtype=np.uint32) << np.uint32(drop)
    return (high[:, None] | low[None, :]).reshape(-1).view(np.float32)


@pytest.mark.parametrize("fmt,dtype", ORACLE_DTYPES, ids=IDS)
def test_nearest_even_sweep_matches_oracle_cast(fmt, dtype):
    x = sweep(fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(dtype).astype(np.float32)
        wide, wide_expected = x.astype(np.float64), expected.astype(np.float64)
    assert same_bits(round_to(x, fmt), expected).all()
    assert same_bits(round_to(wide, fmt), wide_expected).all()


def test_float64_rounds_once_not_through_float32():
    # 1 + 2**-11 + 2**-40 is just above the fp16 tie; float32 would round it onto the tie,
    # and a second rounding would then go to even (1.0). One rounding gives 1 + 2**-10.
    x = 1.0 + 2.0 ** -11 + 2.0 ** -40
    assert np.float32(x) == 1.0 + 2.0 ** -11
    assert round_to(x, "fp16") == 1.0 + 2.0 ** -10
    with np.errstate(over="ignore"):
        via_ml_dtypes = float(np.float64(x).astype(ml_dtypes.bfloat16))
    y = 1.0 + 2.0 ** -8 + 2.0 ** -40  # same trap for bf16
    assert round_to(y, "bf16") == 1.0 + 2.0 ** -7
    assert via_ml_dtypes == 1.0


def test_fp16_underflow_band():
    tiny = FP16.smallest_subnormal
    assert round_to(np.float32(tiny / 2), "fp16") == 0.0           # tie at 2**-25 -> even (0)
    assert round_to(np.nextafter(np.float32(tiny / 2), np.float32(1)), "fp16") == tiny
    assert round_to(tiny * 0.75, "fp16") == tiny
    assert round_to(tiny * 1.5, "fp16") == 2 * tiny                # tie -> even (2 * tiny)
    assert round_to(-tiny / 4, "fp16") == 0.0 and np.signbit(round_to(-tiny / 4, "fp16"))
