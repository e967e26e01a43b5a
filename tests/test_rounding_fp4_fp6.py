"""OCP FP4 (E2M1) and FP6 (E2M3, E3M2): the ``finite`` encoding (no inf, no NaN), its names,
its bits and its rounding, against ml_dtypes' ``float4_e2m1fn``, ``float6_e2m3fn`` and
``float6_e3m2fn`` (an oracle we did not write). Every mode against MPFR and the other
kernels: tests/test_rounding_mpfr.py, test_rounding_portable.py, test_rounding_compiled.py
(they take these formats from ``builtins()`` or their FORMATS lists)."""
import ml_dtypes
import numpy as np
import pytest

from fpsim import formats, round_to
from fpsim.encoding import decode, encode
from fpsim.formats import E2M1, E2M3, E3M2, Format, custom
from fpsim.rounding import MODES, use_compiled
from fpsim.rounding.compiled import available as compiled_available

from bit_patterns import same_bits

ORACLES = [(E2M1, ml_dtypes.float4_e2m1fn), (E2M3, ml_dtypes.float6_e2m3fn),
           (E3M2, ml_dtypes.float6_e3m2fn)]
IDS = [fmt.name for fmt, _ in ORACLES]
KERNELS = [False, True] if compiled_available() else [False]


@pytest.mark.parametrize("name,expected", [
    ("float4_e2m1fn", E2M1), ("fp4_e2m1", E2M1), ("FP4", E2M1), ("float4_e2m1fn_x2", E2M1),
    ("float6_e2m3fn", E2M3), ("fp6_e2m3", E2M3), ("float6_e3m2fn", E3M2), ("fp6-e3m2", E3M2),
])
def test_library_names_mean_the_library_formats(name, expected):
    fmt = formats.get(name)
    assert fmt == expected and fmt.encoding == "finite" and not fmt.has_nan
    assert formats.get(fmt.name) == fmt                    # the name round-trips
    assert (E2M1.max_finite, E2M3.max_finite, E3M2.max_finite) == (6.0, 7.5, 28.0)


def test_bare_fn_names_keep_the_fn_encoding_and_widths_must_add_up():
    assert formats.get("e2m1fn").max_finite == 4.0          # fpsim's eXmYfn pattern
    assert formats.get("e3m1finite") == custom(3, 1, encoding="finite")
    assert formats.get(custom(3, 1, encoding="finite").name) == custom(3, 1, encoding="finite")
    with pytest.raises(ValueError, match=r"^format name 'fp8_e2m1': its width 8 is not "):
        formats.get("fp8_e2m1")


def test_a_finite_format_cannot_be_told_not_to_saturate():
    with pytest.raises(ValueError, match="^x: a 'finite' format has no infinity or NaN to "
                                         "overflow to, so it saturates: saturate must be True"):
        Format("x", 2, 1, 1, encoding="finite")
    assert custom(2, 1, encoding="finite") == E2M1 and custom(2, 1).saturate is False
    with pytest.raises(ValueError, match=r"^saturate=False: fp4_e2m1 has no infinity or NaN "):
        round_to(np.ones(3, np.float32), "fp4", saturate=False)


@pytest.mark.parametrize("fmt,dtype", ORACLES, ids=IDS)
def test_every_pattern_decodes_like_ml_dtypes_and_encodes_back(fmt, dtype):
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    ours = decode(codes, fmt)
    assert same_bits(ours, codes.view(dtype).astype(np.float32))
    assert not np.isnan(ours).any()
    assert np.array_equal(encode(ours, fmt), codes)
    assert np.array_equal(encode(decode(codes, fmt, np.float64), fmt), codes)


@pytest.mark.parametrize("fmt", [E2M1, E2M3, E3M2], ids=IDS)
def test_encode_refuses_nan_and_infinities(fmt):
    with pytest.raises(ValueError, match=f"^NaN has no bit pattern in {fmt.name}, which has "):
        encode(np.float32(np.nan), fmt)
    with pytest.raises(ValueError, match="^inf is not exactly representable"):
        encode(np.float32(np.inf), fmt)


def boundary_values(fmt) -> np.ndarray:
    """float32 values at and around every place the rounding to ``fmt`` changes: each value of
    the format, each midpoint and quarter point between neighbours, one float32 ulp either
    side of each, beyond the largest value, zeros, infinities and NaNs, of both signs."""
    values = np.unique(np.abs(decode(np.arange(1 << fmt.bits, dtype=np.uint8), fmt)))
    values = np.append(values, [2 * fmt.max_finite, 4 * fmt.max_finite, 1e30, np.inf])
    between = [values[:-1] + (values[1:] - values[:-1]) * k / 4 for k in (1, 2, 3)]
    points = np.concatenate([values, *between]).astype(np.float32)
    near = np.concatenate([np.nextafter(points, np.float32(0)), points,
                           np.nextafter(points, np.float32(np.inf))])
    near = np.append(near, [np.float32(1e-40), np.float32(fmt.smallest_subnormal / 2)])
    return np.concatenate([near, -near, np.float32([np.nan, -np.nan])])


def ml_dtypes_cast(x, dtype):
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype).astype(x.dtype)


def assert_nearest_even_like_ml_dtypes(x, fmt, dtype):
    """Every value but NaN as ml_dtypes' cast gives it (saturating overflow, infinities
    included); NaN stays NaN here, where ml_dtypes writes a zero of the other sign."""
    got, theirs = round_to(x, fmt), ml_dtypes_cast(x, dtype)
    nan = np.isnan(x)
    assert same_bits(got[~nan], theirs[~nan])
    assert np.isnan(got[nan]).all()
    assert same_bits(got[nan], np.where(np.signbit(x[nan]), -np.nan, np.nan).astype(x.dtype))


@pytest.mark.parametrize("compiled", KERNELS, ids=["numpy", "compiled"][:len(KERNELS)])
@pytest.mark.parametrize("fmt,dtype", ORACLES, ids=IDS)
def test_nearest_even_matches_ml_dtypes_at_every_boundary(fmt, dtype, compiled):
    previous = use_compiled(compiled)
    try:
        x = boundary_values(fmt)
        assert_nearest_even_like_ml_dtypes(x, fmt, dtype)
        assert_nearest_even_like_ml_dtypes(x.astype(np.float64), fmt, dtype)
        sample = np.random.default_rng(42).integers(0, 2**32, 1 << 16, dtype=np.uint32)
        assert_nearest_even_like_ml_dtypes(sample.view(np.float32), fmt, dtype)
    finally:
        use_compiled(previous)


def test_overflow_infinities_and_nan_pinned_against_ml_dtypes():
    x = np.float32([7.0, 1e30, np.inf, -np.inf, np.nan, -np.nan])
    assert round_to(x, "float4_e2m1fn")[:4].tolist() == [6.0, 6.0, 6.0, -6.0]
    assert ml_dtypes_cast(x, ml_dtypes.float4_e2m1fn).tolist()[:4] == [6.0, 6.0, 6.0, -6.0]
    # ml_dtypes 0.6 writes NaN as a zero of the other sign; here NaN stays NaN, its sign kept
    theirs = ml_dtypes_cast(x[4:], ml_dtypes.float4_e2m1fn)
    assert theirs.tolist() == [0.0, 0.0] and np.signbit(theirs).tolist() == [True, False]
    ours = round_to(x[4:], "fp4")
    assert np.isnan(ours).all() and np.signbit(ours).tolist() == [False, True]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", [E2M1, E2M3, E3M2], ids=IDS)
def test_every_mode_keeps_the_values_and_saturates(fmt, mode):
    options = {"seed": 3} if mode == "stochastic" else {}
    values = decode(np.arange(1 << fmt.bits, dtype=np.uint8), fmt)
    assert same_bits(round_to(values, fmt, mode, **options), values)
    beyond = np.float32([fmt.max_finite * 1.01, np.inf, -fmt.max_finite * 1.01, -np.inf])
    expected = np.float32([1, 1, -1, -1]) * np.float32(fmt.max_finite)
    assert same_bits(round_to(beyond, fmt, mode, **options), expected)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,dtype", ORACLES, ids=IDS)
def test_every_float32_pattern_rounds_like_ml_dtypes(fmt, dtype):
    step = 1 << 26
    for start in range(0, 1 << 32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        assert_nearest_even_like_ml_dtypes(x, fmt, dtype)


@pytest.mark.parametrize("fmt", [E2M1, E2M3, E3M2], ids=IDS)
def test_torch_backend_rounds_to_the_same_bits(fmt):
    pytest.importorskip("torch", reason="the torch backend needs PyTorch")
    from fpsim import backend
    x = boundary_values(fmt)
    expected = {mode: round_to(x, fmt, mode, **({"seed": 5} if mode == "stochastic" else {}))
                for mode in MODES}
    with backend.use_backend("torch"):
        on_torch = backend.asarray(x, backend.xp.float32)
        for mode, want in expected.items():
            options = {"seed": 5} if mode == "stochastic" else {}
            got = backend.to_numpy(backend.round_to(on_torch, fmt, mode, **options))
            assert same_bits(got, want), mode
