"""round_to's contract: containers in and out, switches, and clear errors."""
import numpy as np
import pytest

from fpsim import round_to
from fpsim.formats import E4M3FN, FP16


def test_scalar_kinds_round_trip():
    assert type(round_to(0.1, "fp16")) is float
    assert type(round_to(1, "fp16")) is float
    assert type(round_to(np.float32(0.1), "fp16")) is np.float32
    assert type(round_to(np.float64(0.1), "fp16")) is np.float64
    assert round_to(np.float32(0.1), "fp16") == np.float32(round_to(0.1, "fp16"))
    zero_d = round_to(np.array(0.1, np.float32), FP16)
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero"])
def test_shape_dtype_and_layout(dtype, mode):
    x = np.linspace(-3, 3, 24, dtype=dtype).reshape(2, 3, 4)
    strided = x.transpose(2, 0, 1)[:, ::-1]
    before = strided.copy()
    out = round_to(strided, "bf16", mode)
    assert out.shape == strided.shape and out.dtype == dtype
    assert np.array_equal(strided, before)  # input untouched
    assert np.array_equal(out, round_to(np.ascontiguousarray(strided), "bf16", mode))
    assert round_to(np.empty((0, 3), dtype), "fp16").shape == (0, 3)


def test_idempotent_and_large_array_threads(monkeypatch):
    import fpsim.rounding as rounding
    monkeypatch.setattr(rounding, "_PARALLEL_MIN", 1 << 16)   # threads from this size on
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1 << 19) * np.exp2(rng.integers(-30, 18, 1 << 19))).astype(
        np.float32)
    with np.errstate(over="ignore"):
        once = round_to(x, "fp16")
        expected = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(once, expected)  # split over threads, same bits
    assert np.array_equal(round_to(once, "fp16"), once)


def test_signed_zeros_and_fnuz():
    out = round_to(np.array([0.0, -0.0, -1e-30], np.float32), "fp16")
    assert list(np.signbit(out)) == [False, True, True]
    for mode in ("nearest_even", "toward_zero", "up", "down"):
        fnuz = round_to(np.array([-0.0, -1e-30], np.float32), "e4m3fnuz", mode)
        assert not np.signbit(fnuz[0])
        if mode == "down":
            assert fnuz[1] == -2.0 ** -10  # -(smallest subnormal of e4m3fnuz)
        else:
            assert fnuz[1] == 0 and not np.signbit(fnuz[1])


@pytest.mark.parametrize("mode,expected", [
    ("nearest_even", [np.inf, -np.inf]), ("nearest_away", [np.inf, -np.inf]),
    ("toward_zero", [65504.0, -65504.0]), ("up", [np.inf, -65504.0]),
    ("down", [65504.0, -np.inf]),
])
def test_overflow_follows_ieee_per_mode(mode, expected):
    x = np.array([70000.0, -70000.0])
    assert list(round_to(x, "fp16", mode)) == expected
    assert list(round_to(x, "fp16", mode, saturate=True)) == [65504.0, -65504.0]
    assert list(round_to(np.array([np.inf, -np.inf]), "fp16", mode)) == [np.inf, -np.inf]


def test_formats_without_inf_give_nan_or_saturate():
    x = np.array([448.0, 463.9, 464.0, 464.1, 1e6, np.inf], np.float32)
    assert np.array_equal(round_to(x, E4M3FN), [448, 448, 448, np.nan, np.nan, np.nan],
                          equal_nan=True)
    assert list(round_to(x, E4M3FN, saturate=True)) == [448] * 6
    assert list(round_to(x, E4M3FN.replace(saturate=True))) == [448] * 6
    assert np.isnan(round_to(np.array([np.nan]), "fp16", saturate=True)).all()


def test_nan_stays_nan_everywhere():
    x = np.array([np.nan, -np.nan], np.float32)
    for fmt in ("fp16", "bf16", "e4m3", "e5m2fnuz", "tf32"):
        for mode in ("nearest_even", "up", "down"):
            assert np.isnan(round_to(x, fmt, mode)).all()


def test_subnormal_switches():
    tiny = FP16.smallest_subnormal
    x = np.array([3 * tiny, FP16.min_normal * 0.99999, FP16.min_normal, -3 * tiny])
    assert list(round_to(x, "fp16")) == [3 * tiny, FP16.min_normal, FP16.min_normal, -3 * tiny]
    flushed = round_to(x, "fp16", subnormals=False)
    assert list(flushed) == [0.0, FP16.min_normal, FP16.min_normal, 0.0]
    assert np.signbit(flushed[3])
    assert list(round_to(x, FP16.replace(subnormals=False))) == list(flushed)
    daz = round_to(x, "fp16", daz=True)
    assert list(daz) == [0.0, 0.0, FP16.min_normal, 0.0] and np.signbit(daz[3])


def test_errors_say_what_is_accepted():
    with pytest.raises(ValueError, match="nearest_even, nearest_away"):
        round_to(1.0, "fp16", "nearest")
    with pytest.raises(ValueError, match="unknown format 'fp12'.*half"):
        round_to(1.0, "fp12")
    with pytest.raises(ValueError, match="exactly one of seed"):
        round_to(1.0, "fp16", "stochastic")
    with pytest.raises(ValueError, match="only used by mode='stochastic'"):
        round_to(1.0, "fp16", rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="float32 or float64.*float16"):
        round_to(np.ones(3, np.float16), "bf16")
    with pytest.raises(TypeError, match="float32 or float64.*int64"):
        round_to(np.arange(3), "fp16")
    with pytest.raises(TypeError, match="got str"):
        round_to("0.1", "fp16")


NAN_PATTERNS_32 = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFF0000, 0x7FC00001,
                            0x7FA00000, 0x7FFFFFFF, 0xFF812345], np.uint32)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "tf32", "e5m2", "e4m3fn", "e4m3fnuz",
                                 "e5m2fnuz", "e3m4", "fp32"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "down"])
def test_nan_results_are_nans_the_format_holds(fmt, mode):
    from fpsim import decode, encode, formats

    x32 = NAN_PATTERNS_32.view(np.float32)
    with np.errstate(invalid="ignore"):
        x64 = x32.astype(np.float64)
    for x in (x32, x64):
        out = round_to(x, fmt, mode)
        uint = np.uint32 if out.dtype == np.float32 else np.uint64
        assert np.isnan(out).all()
        again = decode(encode(out, fmt), fmt, out.dtype)
        assert np.array_equal(again.view(uint), out.view(uint))  # exactly representable
        quiet_bit = uint(1 << (22 if uint is np.uint32 else 51))
        assert (out.view(uint) & quiet_bit).all()
        if formats.get(fmt).encoding != "fnuz":
            assert np.array_equal(np.signbit(out), np.signbit(x))
    # the bf16 fast path keeps the payload bits that fit, as torch's bf16 cast does
    assert round_to(np.uint32([0xFFFF0000]).view(np.float32), "bf16").view(np.uint32)[0] \
        == 0xFFFF0000


def test_work_buffers_are_per_thread_and_grow():
    """The kernels reuse one set of work buffers per thread: calls from many threads at once,
    of sizes that make the buffers grow, give NumPy's float16 bits."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    inputs = [(rng.standard_normal(n) * 2.0 ** rng.integers(-20, 10)).astype(np.float32)
              for n in (5, 3000, 40000, 200000, 17, 70000)]
    with np.errstate(over="ignore"):
        expected = [x.astype(np.float16).astype(np.float32).view(np.uint32) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            results = list(pool.map(lambda x: round_to(x, FP16), inputs * 3))
            for got, want in zip(results, expected * 3):
                np.testing.assert_array_equal(got.view(np.uint32), want)
