"""The compiled rounding loops (``fpsim.rounding.compiled``, Numba) against the NumPy kernels:
the same bits for every mode, option, format and container, forced each way by
``use_compiled``, on inputs built for every branch: ties and the neighbours of ties, the
overflow threshold and its neighbours, the subnormal and flush edges, infinities, signed zeros,
quiet and signalling NaNs with payloads of both signs, random bit patterns; stochastic rounding
across the 2**32 counter carry, with a key near 2**64, split over threads. Without Numba these
tests skip (``round_to`` then runs the NumPy kernels only)."""
from __future__ import annotations

import numpy as np
import pytest

import fpsim.rounding as rounding
from fpsim.formats import get
from fpsim.rounding import philox_uniforms, round_to, use_compiled
from fpsim.rounding._kernels import Rules
from fpsim.rounding.compiled import available, float32_loop

from bit_patterns import same_bits

pytestmark = pytest.mark.skipif(not available(), reason="Numba is not installed "
                                "(pip install 'fpsim[fast]'); round_to runs the NumPy kernels")

FORMATS = ["fp16", "bf16", "e4m3fn", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "tf32", "e2m1",
           "e5m21", "e5m22", "e8m22", "fp4_e2m1", "fp6_e2m3", "fp6_e3m2"]
MODES = rounding.MODES
OPTIONS = [{}, {"saturate": True}, {"subnormals": False}, {"daz": True},
           {"saturate": True, "subnormals": False, "daz": True}]


@pytest.fixture
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def edges(fmt, dtype) -> np.ndarray:
    """Values at every place a branch of the rounding changes: each binade's ends, its ties
    and their neighbours one container ulp away, around the smallest subnormal, the smallest
    normal, the largest finite value and the overflow threshold, in both signs; infinities,
    zeros and NaNs (quiet and signalling, payloads, both signs)."""
    finfo = np.finfo(dtype)
    anchors = [fmt.max_finite, fmt.min_normal, fmt.min_normal * 2.0 ** -fmt.man_bits]
    binades = 2.0 ** np.arange(max(fmt.emin - fmt.man_bits - 2, finfo.minexp),
                               min(fmt.emax + 3, finfo.maxexp))
    points = []
    for base in np.concatenate([anchors, binades]):
        gap = max(base * 2.0 ** -fmt.man_bits, fmt.min_normal * 2.0 ** -fmt.man_bits)
        points += [base, base + gap / 2, base + gap / 4, base + 3 * gap / 4, base + gap,
                   base + 3 * gap / 2, base - gap / 2]
    with np.errstate(over="ignore"):
        values = np.array(points, dtype)
        values = np.concatenate([values, np.nextafter(values, np.inf, dtype=dtype),
                                 np.nextafter(values, 0, dtype=dtype)])
    values = np.concatenate([values, -values])
    uint = np.uint32 if dtype == np.float32 else np.uint64
    width = 32 if dtype == np.float32 else 64
    exp_all = ((1 << (finfo.nexp)) - 1) << finfo.nmant
    specials = [0, 1, exp_all, exp_all | 1, exp_all | (1 << (finfo.nmant - 1)),
                exp_all | (1 << (finfo.nmant - 1)) | 0x2A, exp_all | 0x155]
    specials = np.array(specials + [s | (1 << (width - 1)) for s in specials], uint)
    return np.concatenate([values, specials.view(dtype)])


def random_patterns(dtype, n=20000, seed=7) -> np.ndarray:
    uint = np.uint32 if dtype == np.float32 else np.uint64
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(uint).max, n, dtype=uint, endpoint=True).view(dtype)


def both_ways(x, fmt, mode, **options):
    """round_to's result on the compiled loops and on the NumPy kernels."""
    with np.errstate(over="ignore", invalid="ignore"):
        use_compiled(True)
        compiled = round_to(x, fmt, mode, **options)
        use_compiled(False)
        reference = round_to(x, fmt, mode, **options)
    return compiled, reference


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_mode_and_option_gives_the_numpy_kernels_bits(name, dtype, restore_choice):
    fmt = get(name)
    x = np.concatenate([edges(fmt, dtype), random_patterns(dtype)])
    for mode in MODES:
        seeds = {"seed": 2**64 - 3, "offset": 2**32 - 100} if mode == "stochastic" else {}
        for options in OPTIONS:
            compiled, reference = both_ways(x, fmt, mode, **seeds, **options)
            assert same_bits(compiled, reference), (name, dtype, mode, options)


def test_each_float32_loop_is_among_the_formats_compared():
    """Nearest even on float32 data runs one of three loops; the parity test above meets
    each: the integer one (float32's exponent range), the magic-number one, the float64 one."""
    def kind(name, **options):
        fmt = get(name)
        return float32_loop(Rules.of(fmt, subnormals=options.get("subnormals", fmt.subnormals),
                                     saturate=options.get("saturate", fmt.saturate),
                                     daz=options.get("daz", False)))
    assert kind("bf16") == kind("tf32") == kind("e8m22") == "same_range"
    assert kind("fp16") == kind("e4m3fn") == kind("e5m2fnuz") == kind("e5m21") == "magic"
    assert kind("bf16", saturate=True) == kind("fp16", daz=True) is None
    assert kind("bf16", subnormals=False) is None


def test_the_fast_route_and_scalars_take_the_compiled_loops_too(restore_choice):
    """round_to's fast route (defaults, native array), 0-d arrays and Python floats."""
    x = np.concatenate([edges(get("fp16"), np.float32), random_patterns(np.float32)])
    for data in (x, x[:1], x[:0], x.reshape(-1, 2)[:, 0].copy()):
        assert same_bits(*both_ways(data, "fp16", "nearest_even"))
    for value in (65520.0, -2.0 ** -25, 1 + 2.0 ** -11, float("nan")):
        compiled, reference = both_ways(value, "fp16", "nearest_even")
        assert type(compiled) is float and np.array_equal(np.float64(compiled).view(np.uint64),
                                                         np.float64(reference).view(np.uint64))


def test_stochastic_bits_do_not_depend_on_the_thread_split(restore_choice, monkeypatch):
    """Each thread draws from its own global element indices: two threads from a small size
    on give the one-thread bits, across the low counter word's carry."""
    x = random_patterns(np.float32, n=1 << 15, seed=3)
    one_thread = both_ways(x, "e5m2", "stochastic", seed=11, offset=2**32 - 5000)
    monkeypatch.setattr(rounding, "_PARALLEL_MIN", 1 << 10)
    two_threads = both_ways(x, "e5m2", "stochastic", seed=11, offset=2**32 - 5000)
    for got in (*one_thread, *two_threads):
        assert same_bits(got, one_thread[1])


def test_stochastic_rounding_uses_the_documented_draw(restore_choice):
    """Element i goes up exactly when philox_uniforms(seed, offset + i) is below its
    fraction: halfway values go up for u < 1/2, values a quarter past for u < 1/4."""
    n = 4096
    uniforms = philox_uniforms(5, 2**40, n)
    half = np.full(n, 1 + 2.0 ** -11, np.float32)       # fp16 tie between 1 and 1 + 2**-10
    quarter = np.full(n, 1 + 2.0 ** -12, np.float32)
    use_compiled(True)
    assert np.array_equal(round_to(half, "fp16", "stochastic", seed=5, offset=2**40) > 1,
                          uniforms < 0.5)
    assert np.array_equal(round_to(quarter, "fp16", "stochastic", seed=5, offset=2**40) > 1,
                          uniforms < 0.25)
    # below the smallest subnormal, u * 2**-24 is exact in float64: its fraction is u itself,
    # so "u < fraction" never holds, and every element rounds down (an "<=" would round up)
    at_the_draw = uniforms * 2.0 ** -24
    for compiled in (True, False):
        use_compiled(compiled)
        got = round_to(at_the_draw, "fp16", "stochastic", seed=5, offset=2**40)
        assert not got.any(), compiled


def test_use_compiled_refuses_what_it_cannot_do(restore_choice, monkeypatch):
    with pytest.raises(TypeError, match="enabled must be True or False"):
        use_compiled("yes")
    monkeypatch.setattr(rounding, "compiled_available", lambda: False)
    with pytest.raises(ValueError, match="needs Numba"):
        use_compiled(True)
    assert use_compiled(False) is True       # the previous choice, for restoring it
