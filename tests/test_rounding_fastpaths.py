"""``round_to``'s fast route and the magic kernel against the general route and the float64
every-mode kernel: same bits for every format setting, both containers, every size class
(the one-chunk call, several chunks, the small-array clip), and the special values (signed
zeros, subnormals, overflow, inf, NaN payloads of both signs). These are the NumPy kernels:
every test here runs with the compiled loops switched off (``tests/test_rounding_compiled.py``
compares those with these)."""
import numpy as np
import pytest

import fpsim.rounding as rounding
from fpsim.autograd.numerics import round_array
from fpsim.formats import FP16, Format, custom, get
from fpsim.rounding import round_to
from fpsim.rounding._kernels import Rules, magic_applies, round_any_mode

from bit_patterns import same_bits
from child_env import child_env

@pytest.fixture(autouse=True)
def numpy_kernels():
    """round_to on its NumPy kernels, whether Numba is installed or not."""
    previous = rounding.use_compiled(False)
    yield
    rounding.use_compiled(previous)


FORMATS = ["fp16", "bf16", "e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz", "tf32", "e2m1", "e5m21",
           "e3m20", "e5m22", "e8m22"]
FLAGS = [(True, False), (False, False), (True, True), (False, True)]


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-152, 130, n)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    specials = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x7F800000,
                         0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFBFFFFF,
                         0x477FF000, 0x477FEFFF, 0xC77FF000, 0x33000000, 0xB3000001],
                        np.uint32).view(np.float32)
    x32[:specials.size] = specials[:n]
    return x32


def _both(x):
    """x and x widened to float64 (signalling NaNs quieten, with a warning NumPy raises)."""
    with np.errstate(invalid="ignore"):
        return x, x.astype(np.float64)


def _reference(x, fmt, subnormals, saturate):
    """The every-mode float64 kernel (no magic constant involved)."""
    rules = Rules.of(fmt, subnormals=subnormals, saturate=saturate, daz=False)
    out = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore"):
        round_any_mode(x.astype(np.float64), out, rules, "nearest_even", None)
    return out


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("subnormals,saturate", FLAGS)
def test_magic_kernel_matches_the_every_mode_kernel(name, subnormals, saturate):
    fmt = get(name).replace(subnormals=subnormals, saturate=saturate)
    for n in (3000, 9000, (1 << 17) + 5):          # max/min clip, np.clip, two chunks
        x = _data(n, seed=n)
        for data in _both(x):
            with np.errstate(invalid="ignore"):    # signalling NaNs widen with a warning
                expected = _reference(data, fmt, subnormals, saturate)
            with np.errstate(over="ignore", invalid="ignore"):
                got = round_to(data, fmt)
            assert same_bits(got, expected), (name, subnormals, saturate, n, data.dtype)


SPECIALS = {"none": None, "+0": 0.0, "-0": -0.0, "tiny": -2.0 ** -140, "half-ulp": -2.0 ** -25,
            "subnormal": 3.1e-6, "big": -40000.0, "tie-to-inf": 65520.0, "inf": np.inf,
            "nan": np.nan}


@pytest.mark.parametrize("name", ["fp16", "e4m3", "e5m2fnuz", "e4m3fnuz", "bf16", "e2m1"])
@pytest.mark.parametrize("subnormals,saturate", FLAGS)
@pytest.mark.parametrize("special", SPECIALS)
def test_magic_kernel_steps_that_only_some_elements_need(name, subnormals, saturate, special):
    """Data within one binade band takes the short route (no clip, overflow step, flush, sign
    fix or NaN settling); one special element brings back exactly the steps it needs."""
    fmt = get(name).replace(subnormals=subnormals, saturate=saturate)
    rng = np.random.default_rng(1)
    for n in (40, 9000):
        x = (rng.uniform(1, 2, n) * rng.choice([-1, 1], n) * 2.0 ** fmt.emin).astype(np.float32)
        if SPECIALS[special] is not None:
            x[n // 3] = SPECIALS[special]
        for data in _both(x):
            with np.errstate(invalid="ignore"):
                expected = _reference(data, fmt, subnormals, saturate)
            with np.errstate(over="ignore", invalid="ignore"):
                got = round_to(data, fmt)
            assert same_bits(got, expected), (name, subnormals, saturate, special, n)


def test_magic_kernel_needs_two_spare_bits():
    """x + 1.5 C stays in C's binade only when the container has two more mantissa bits than
    the format: 22-bit formats in float32 widen to float64 first."""
    def rules(fmt):
        return Rules.of(fmt, subnormals=True, saturate=False, daz=False)

    assert magic_applies(rules(custom(5, 21)), np.float32)
    assert not magic_applies(rules(custom(5, 22)), np.float32)
    assert magic_applies(rules(custom(5, 22)), np.float64)


@pytest.mark.parametrize("name", ["fp16", "bf16", "e4m3", "e4m3fnuz", "e5m22", "tf32"])
def test_fast_route_is_the_general_route(name):
    """The fast route (defaults, native C-ordered array) against the same call with the
    format's own flags spelled out, which takes the general route."""
    fmt = get(name)
    x = _data(5000)
    for data in (*_both(x), x[:1], x[:0], x.reshape(50, 100)):
        with np.errstate(over="ignore", invalid="ignore"):
            fast = round_to(data, name)
            general = round_to(data, fmt, subnormals=fmt.subnormals, saturate=fmt.saturate)
        assert same_bits(fast, general), (name, data.dtype, data.shape)
        assert fast is not data and not np.shares_memory(fast, data)


def test_fast_route_leaves_other_inputs_to_the_general_route():
    x = _data(100)
    strided = x[::2]
    swapped = x.astype(">f4")
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(round_to(strided, "fp16"), round_to(strided.copy(), "fp16"))
        assert same_bits(round_to(swapped, "fp16"), round_to(x, "fp16"))
        assert same_bits(round_to(np.float32(70000.0), "fp16"), np.float32(np.inf))
    assert rounding._default_kernel(FP16, np.dtype(np.float16), False) is None
    with pytest.raises(TypeError):
        round_to(x, ["fp16"])
    with pytest.raises(ValueError, match="unknown format"):
        round_to(x, "fp17")


@pytest.mark.parametrize("n", [1, 15, 2047, 2048, 2049, 9000])
def test_fp16_by_float16_cast_around_its_size(n, monkeypatch):
    """round_to(x, "fp16") takes NumPy's float16 cast below ``_FLOAT16_CAST_BELOW`` elements
    (its NaNs through the magic kernel), the magic kernel from there; round_array follows
    round_to: both give the general route's bits (n >= 15: every special value)."""
    calls = []
    cast = rounding._small_by_float16_cast
    monkeypatch.setattr(rounding, "_small_by_float16_cast",
                        lambda src, dst, magic: calls.append(src.size) or cast(src, dst, magic))
    rounding._default_kernel.cache_clear()
    try:
        for data in _both(_data(n, seed=n)):
            with np.errstate(over="ignore", invalid="ignore"):
                general = round_to(data, FP16, subnormals=True, saturate=False)
                assert same_bits(round_to(data, "fp16"), general)
                assert same_bits(round_array(data, FP16), general.astype(np.float32))
    finally:
        rounding._default_kernel.cache_clear()
    assert calls and set(calls) == {n}          # the fast route ran (general: never)
    assert (n < rounding._FLOAT16_CAST_BELOW) == (n < 2048)


def test_format_equality_and_hash_ignore_the_name():
    fp16 = get("fp16")
    twin = Format("half-by-another-name", 5, 10, 15)
    assert fp16 == twin and hash(fp16) == hash(twin) and fp16 is not twin
    assert fp16 != fp16.replace(saturate=True) and fp16 != custom(5, 9)
    assert fp16 != "fp16" and not (fp16 == 16)
    assert len({fp16, twin, custom(5, 10)}) == 1


def test_format_hash_is_the_same_in_every_process():
    """The hash is computed once, from ints only: a format pickled into another process (a
    sweep worker) keeps a hash that agrees with that process's own formats."""
    import pickle
    import subprocess
    import sys

    code = ("import pickle, sys; from fpsim.formats import get; "
            "f = pickle.loads(sys.stdin.buffer.read()); "
            "print(hash(f) == hash(get('e4m3fnuz')), f == get('e4m3fnuz'), hash(get('fp16')))")
    env = child_env(PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(get("e4m3fnuz")),
                         capture_output=True, env=env, check=True).stdout.decode().split()
    assert out == ["True", "True", str(hash(get("fp16")))]
