"""``fpsim.rounding.portable`` (issue 23): rounding and Philox written once on the backend
namespace give ``round_to``'s and ``philox_uniforms``' bits, for every format and mode,
signed zeros and NaN payloads included, on the NumPy backend and under ``numpy-strict``.

numpy-strict checks array use only where the calling frame is engine code
(``interface.is_engine_module``), and ``fpsim.rounding`` is not: so under it the tests run
portable.py's own source as an engine module (``portable_as_engine_code``), and a static
test reads the source for what no run shows (array methods, unsigned dtypes, NumPy).
"""
from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from bit_patterns import same_bits
from fpsim import backend
from fpsim.backend import ARRAY_ATTRIBUTES, NAMESPACE
from fpsim.backend.interface import is_engine_module
from fpsim.backend.strict import StrictError
from fpsim.formats import builtins
from fpsim.rounding import MODES, philox4x32, philox_uniforms, portable, round_to

FORMATS = builtins()
FORMAT_IDS = [fmt.name for fmt in FORMATS]
SOURCE = Path(portable.__file__)
PROBE_NAME = "fpsim.exact.portable_rounding_probe"   # any engine module name


def portable_as_engine_code(source: str = SOURCE.read_text()) -> types.ModuleType:
    """portable.py (or ``source``) executed as the engine module PROBE_NAME, so numpy-strict
    checks every array operation in it; its relative imports still resolve in
    fpsim.rounding (``__package__``)."""
    assert is_engine_module(PROBE_NAME)
    module = types.ModuleType(PROBE_NAME)
    module.__package__ = "fpsim.rounding"
    exec(compile(source, str(SOURCE), "exec"), module.__dict__)
    return module


class Engine(NamedTuple):
    ops: object                # the backend, as fpsim.backend.current() gives it
    module: types.ModuleType   # round_to_portable and philox_uniforms_portable


@pytest.fixture(scope="module")
def strict_portable():
    return portable_as_engine_code()


@pytest.fixture(params=["numpy", "numpy-strict"])
def engine(request, strict_portable):
    with backend.use_backend(request.param):
        yield Engine(backend.current(),
                     portable if request.param == "numpy" else strict_portable)


def check_same_bits(engine: Engine, x: np.ndarray, fmt, mode: str, **options) -> int:
    """round_to_portable on the backend's copy of host array ``x`` has round_to's dtype,
    shape and bits, and leaves x as it was; returns the number of elements compared."""
    expected = round_to(x, fmt, mode, **options)
    before = x.copy()
    device_x = engine.ops.asarray(x, x.dtype)
    got = engine.ops.to_numpy(engine.module.round_to_portable(engine.ops, device_x, fmt, mode,
                                                              **options))
    assert same_bits(engine.ops.to_numpy(device_x), before), "the input changed"
    if not same_bits(got, expected):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        uint = np.uint32 if x.dtype == np.float32 else np.uint64
        wrong = np.flatnonzero(got.reshape(-1).view(uint) != expected.reshape(-1).view(uint))
        shown = [f"{x.reshape(-1)[i]!r} ({int(x.reshape(-1).view(uint)[i]):#x}): "
                 f"{got.reshape(-1)[i]!r} != {expected.reshape(-1)[i]!r}" for i in wrong[:5]]
        pytest.fail(f"{fmt} {mode} {options} {x.dtype}: {wrong.size} elements differ, e.g. "
                    + "; ".join(shown))
    return x.size


def options_of(mode: str, seed: int = 0x5EED, offset: int = 12345) -> dict:
    return {"seed": seed, "offset": offset} if mode == "stochastic" else {}


def widen(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):          # signalling NaNs come out quiet: expected
        return x.astype(np.float64)


# --- inputs ---------------------------------------------------------------------------------

HI16 = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
HI16_FLOAT64 = (np.arange(1 << 16, dtype=np.uint64) << np.uint64(48)).view(np.float64)

NAN_BITS_32 = [0x7F800001, 0x7FA00000, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FC12345,
               0x7FDFFFFF, 0x7FFFE000, 0x7FFFFFFF, 0xFF800001, 0xFFC0ABCD, 0xFFFFFFFF]
NAN_BITS_64 = [0x7FF0000000000001, 0x7FF4000000000000, 0x7FF7FFFFFFFFFFFF,
               0x7FF8000000000000, 0x7FF8000000000001, 0x7FF8000020000000,
               0x7FFC0000DEADBEEF, 0x7FFFFFFFFFFFFFFF, 0xFFF0000000000001,
               0xFFF8123456789ABC, 0xFFFFFFFFFFFFFFFF]


def format_grid(fmt, every_up_to: int, sampled: int) -> np.ndarray:
    """Non-negative values of ``fmt`` (float64): all of them if they are at most
    ``every_up_to``, else in each binade and among the subnormals the first, middle and last
    few fractions and ``sampled`` more; zero and max_finite always."""
    p = fmt.man_bits
    if (fmt.emax - fmt.emin + 2) << p <= every_up_to:
        fractions = np.arange(1 << p)
    else:
        ends = [0, 1, 2, 3, (1 << (p - 1)) - 1, 1 << (p - 1), (1 << (p - 1)) + 1,
                (1 << p) - 3, (1 << p) - 2, (1 << p) - 1]
        drawn = np.random.default_rng(p).integers(0, 1 << p, sampled)
        fractions = np.unique(np.concatenate([ends, drawn]))
    exponents = np.arange(fmt.emin, fmt.emax + 1, dtype=np.float64)
    normals = (1.0 + fractions / 2.0 ** p)[None, :] * np.exp2(exponents)[:, None]
    subnormals = fractions * 2.0 ** (fmt.emin - p)
    grid = np.concatenate([normals.ravel(), subnormals, [fmt.max_finite]])
    return np.unique(grid[grid <= fmt.max_finite])


def hard_cases(fmt, every_up_to: int = 40_000, sampled: int = 24):
    """(float32, float64) inputs, both signs: format values; the midpoints above each (the
    midpoint above max_finite is the overflow threshold, the one above 0 half the smallest
    subnormal) and the quarter points; each with its neighbours in the container; values
    around 2**(emax + 1); the containers' subnormals, huge values, infinities and NaNs with
    payloads. Every value (and midpoint) of fp16, bf16 and the 8-bit formats by default."""
    grid = format_grid(fmt, every_up_to, sampled)
    quantum = np.exp2(np.maximum(np.floor(np.log2(np.where(grid > 0, grid, 1.0))), fmt.emin)
                      - fmt.man_bits)
    quantum[grid == 0] = 2.0 ** (fmt.emin - fmt.man_bits)
    points = np.concatenate([grid, grid + quantum / 2, grid + quantum / 4,
                             grid + 3 * quantum / 4,
                             [2.0 ** (fmt.emax + 1), 2.0 * fmt.max_finite, 2.0 ** -149,
                              3 * 2.0 ** -149, 2.0 ** -126 - 2.0 ** -149, 2.0 ** -126,
                              float(np.finfo(np.float32).max)]])
    with np.errstate(over="ignore"):                # the largest values' neighbours: inf
        as32 = points.astype(np.float32)
        as32 = np.concatenate([as32, np.nextafter(as32, np.float32(np.inf)),
                               np.nextafter(as32, np.float32(0))])
        as64 = np.concatenate([points, np.nextafter(points, np.inf), np.nextafter(points, 0.0),
                               [5e-324, 2.0 ** -1022, 2.0 ** -1022 - 5e-324, 1e300,
                                float(np.finfo(np.float64).max)]])
    specials32 = np.array(NAN_BITS_32 + [0x7F800000], np.uint32).view(np.float32)
    specials64 = np.array(NAN_BITS_64 + [0x7FF0000000000000], np.uint64).view(np.float64)
    as32 = np.unique(as32[np.isfinite(as32)])
    as64 = np.unique(as64[np.isfinite(as64)])
    return (np.concatenate([as32, -as32, specials32]),
            np.concatenate([as64, -as64, specials64, widen(specials32)]))


# --- round_to_portable against round_to ------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_every_hi16_pattern(engine, fmt, mode):
    """All 2**16 float32 patterns (hi16 << 16), widened to float64, and all 2**16 float64
    patterns (hi16 << 48): every exponent of both containers, both signs, inf and NaNs."""
    for x in (HI16, widen(HI16), HI16_FLOAT64):
        check_same_bits(engine, x, fmt, mode, **options_of(mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_hard_cases(engine, fmt, mode):
    for x in hard_cases(fmt):
        check_same_bits(engine, x, fmt, mode, **options_of(mode))


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_every_float32_in_the_critical_binades(fmt, mode):
    """Every float32 (both signs) in the binades where a format's rounding changes rules:
    below half its smallest subnormal, its subnormals and smallest normals, 1, its largest
    finite binade and the one above (overflow), 2**24 patterns at a time; float32's own
    subnormals stand for binades below its range (measured: 20 to 60 s a format and
    deterministic mode, a few minutes stochastic, on one shared core)."""
    exponents = {fmt.emin - fmt.man_bits - 1, fmt.emin - 1, fmt.emin, 0, fmt.emax, fmt.emax + 1}
    fields = sorted({min(max(e + 127, 0), 254) for e in exponents})
    fraction = np.arange(1 << 23, dtype=np.uint32)
    with backend.use_backend("numpy"):
        engine = Engine(backend.current(), portable)
        for i, field in enumerate(fields):
            magnitudes = np.uint32(field << 23) | fraction
            x = np.concatenate([magnitudes, magnitudes | np.uint32(1 << 31)]).view(np.float32)
            check_same_bits(engine, x, fmt, mode, **options_of(mode, offset=i << 24))


FLAGS = [{"subnormals": False}, {"subnormals": True}, {"saturate": True},
         {"saturate": False}, {"daz": True},
         {"subnormals": False, "saturate": True, "daz": True}]


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
def test_subnormal_saturate_and_daz_options(engine, fmt):
    cases = hard_cases(fmt, every_up_to=1000, sampled=4)
    for flags in FLAGS:
        if flags.get("saturate") is False and not fmt.has_nan:
            continue                   # finite formats refuse it (test_rounding_fp4_fp6)
        for mode in MODES:
            for x in cases:
                check_same_bits(engine, x, fmt, mode, **flags, **options_of(mode))


SEEDS = [0, 1, 0xDEADBEEF12345678, 2**64 - 1]
OFFSETS = [0, 7, 2**32 - 100, 2**63 + 5]      # 2**32 - 100: the counter's high word turns


def test_stochastic_seeds_and_offsets(engine):
    x = hard_cases(formats_by_name("e4m3fn"))[0]
    for seed in SEEDS:
        for offset in OFFSETS + [2**64 - x.size]:
            for fmt in ("fp16", "bf16", "e4m3fn", "e5m2fnuz"):
                check_same_bits(engine, x, fmt, "stochastic", seed=seed, offset=offset)


def test_shapes_zero_d_and_empty(engine):
    """Element i in C order takes counter offset + i whatever the layout (a transposed
    input); 0-d and empty arrays keep their shape and dtype."""
    grid = np.linspace(-3, 3, 24)
    for x in (grid.reshape(4, 6).astype(np.float32), grid.reshape(2, 3, 4).T.copy().T,
              np.array(0.1, np.float32), np.array(2.0 ** -25 * 3), np.zeros((0, 3))):
        for mode in MODES:
            check_same_bits(engine, x, "fp16", mode, **options_of(mode))
    transposed = engine.ops.asarray(grid.reshape(4, 6), np.float64).T
    got = engine.module.round_to_portable(engine.ops, transposed, "e4m3", "stochastic", seed=3)
    assert same_bits(engine.ops.to_numpy(got),
                     round_to(np.ascontiguousarray(grid.reshape(4, 6).T), "e4m3",
                              "stochastic", seed=3))


def formats_by_name(name: str):
    return {fmt.name: fmt for fmt in FORMATS}[name]


BAD_CALLS = [
    ("fp16", "sideways", {}), ("fp16", "nearest_even", {"seed": 1}),
    ("fp16", "up", {"offset": 2}), ("fp16", "stochastic", {}),
    ("fp16", "stochastic", {"seed": -1}), ("fp16", "stochastic", {"seed": 1, "offset": 2**64}),
    ("fp16", "stochastic", {"seed": 1.5}),
    ("fp16", "stochastic", {"seed": 1, "offset": 2**64 - 2}),     # 3 elements pass 2**64
    ("fp16", "nearest_even", {"subnormals": 1}), ("fp16", "nearest_even", {"daz": "yes"}),
    ("e9m2", "nearest_even", {}), (3, "nearest_even", {}),
]


@pytest.mark.parametrize("fmt,mode,options", BAD_CALLS)
def test_refuses_what_round_to_refuses_with_its_message(engine, fmt, mode, options):
    x = np.ones(3, np.float32)
    with pytest.raises((TypeError, ValueError)) as expected:
        round_to(x, fmt, mode, **options)
    with pytest.raises(expected.type) as got:
        engine.module.round_to_portable(engine.ops, engine.ops.asarray(x), fmt, mode, **options)
    assert str(got.value) == str(expected.value)


def test_refuses_other_dtypes(engine):
    for dtype in (np.float16, np.int32):
        x = np.ones(2, dtype)
        with pytest.raises(TypeError) as expected:
            round_to(x, "fp16")
        with pytest.raises(TypeError) as got:
            engine.module.round_to_portable(engine.ops, engine.ops.asarray(x, dtype), "fp16")
        assert str(got.value) == str(expected.value)


# --- Philox ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_philox_uniforms_portable_same_bits(engine, seed):
    for offset, n in [(0, 0), (0, 1000), (2**32 - 3, 7), (2**63 + 5, 100), (2**64 - 9, 9)]:
        got = engine.ops.to_numpy(engine.module.philox_uniforms_portable(engine.ops, seed,
                                                                         offset, n))
        assert same_bits(got, philox_uniforms(seed, offset, n))


def test_philox4x32_portable_same_words(engine):
    """Every word of the rounds (not only the two the uniforms keep), on random and extreme
    words (0 and 2**32 - 1, where the products' partial sums are largest), any rounds."""
    rng = np.random.default_rng(23)
    words = rng.integers(0, 2**32, (4, 4096), dtype=np.uint64)
    words[:, :4] = [[0, 2**32 - 1, 2**32 - 1, 0x243F6A88]] * 4
    for key in [(0, 0), (2**32 - 1, 2**32 - 1), (0xA4093822, 0x299F31D0)]:
        for rounds in (1, 7, 10):
            expected = philox4x32([w.astype(np.uint32) for w in words], key, rounds)
            counter = tuple(engine.ops.asarray(w.astype(np.int64), np.int64) for w in words)
            got = engine.module.philox4x32_portable(engine.ops, counter, key, rounds)
            for g, e in zip(got, expected):
                assert np.array_equal(engine.ops.to_numpy(g), e.astype(np.int64))


# --- the source: only the namespace, the kernels and portable array use ----------------------

KERNELS = {"xp", "astype", "bitcast", "size", "scalar", "errstate"}
ARRAY_LIBRARIES = {"numpy", "ml_dtypes", "torch", "cupy", "jax"}
ARRAY_ONLY = set(dir(np.ndarray)) - ARRAY_ATTRIBUTES   # methods and attributes of NumPy's
DTYPE_NAMES = {"float16", "float32", "float64", "int8", "int32", "int64", "intp", "uint8",
               "uint16", "uint32", "uint64", "bool_"}


def portability_problems(source: str) -> list[str]:
    """What in ``source`` another array library may not do: array attributes outside
    ARRAY_ATTRIBUTES, xp names outside NAMESPACE, kernels outside KERNELS, dtype calls
    (scalar constructors), negative-step slices, any unsigned dtype (torch's have no
    arithmetic), imports of an array library."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", "?")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
            if any(m.split(".")[0] in ARRAY_LIBRARIES for m in modules):
                problems.append(f"{line}: imports an array library")
        elif isinstance(node, ast.Attribute):
            base = node.value
            is_xp = (isinstance(base, ast.Name) and base.id == "xp"
                     or isinstance(base, ast.Attribute) and base.attr == "xp")
            if is_xp and node.attr not in NAMESPACE:
                problems.append(f"{line}: xp.{node.attr} is not in NAMESPACE")
            elif isinstance(base, ast.Name) and base.id == "ops":
                if node.attr not in KERNELS:
                    problems.append(f"{line}: ops.{node.attr} is not a kernel it may use")
            elif not is_xp and node.attr in ARRAY_ONLY:
                problems.append(f"{line}: .{node.attr} of an array")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in DTYPE_NAMES):
            problems.append(f"{line}: {node.func.attr}(...) constructs a scalar")
        elif isinstance(node, ast.Slice) and node.step is not None:
            problems.append(f"{line}: a slice with a step")
        names = [getattr(node, "id", ""), getattr(node, "attr", ""),
                 node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and len(node.value) < 10 else ""]          # a dtype name, not a docstring
        if any("uint" in name for name in names):
            problems.append(f"{line}: an unsigned dtype ({' '.join(names).strip()})")
    return problems


def test_portable_source_uses_arrays_portably():
    assert portability_problems(SOURCE.read_text()) == []


def test_the_source_check_catches_what_it_should():
    planted = ("import numpy as np\n"
               "def f(ops, x):\n"
               "    xp = ops.xp\n"
               "    y = x.astype(xp.float64)\n"         # an array method
               "    z = ops.bits(x) + 1\n"              # not an allowed kernel (unsigned)
               "    w = xp.exp(y) * xp.float32(2)\n"    # not in NAMESPACE; a scalar constructor
               "    return y.view(xp.uint32)[::-1], x.size\n")
    assert sorted(p.split(": ", 1)[1] for p in portability_problems(planted)) == sorted([
        "imports an array library", ".astype of an array", "ops.bits is not a kernel it may use",
        "xp.exp is not in NAMESPACE", "float32(...) constructs a scalar", ".view of an array",
        "an unsigned dtype (uint32)", "a slice with a step", ".size of an array"])


def test_strict_run_catches_non_portable_code():
    """The probe makes numpy-strict check portable.py's frames: a planted array method
    in the same source raises StrictError there."""
    planted = SOURCE.read_text().replace("magnitude = xp.abs(x)\n",
                                         "magnitude = xp.abs(x)\n    x.size\n", 1)
    assert planted != SOURCE.read_text()
    module = portable_as_engine_code(planted)
    with backend.use_backend("numpy-strict"):
        ops = backend.current()
        with pytest.raises(StrictError, match=r"\.size"):
            module.round_to_portable(ops, ops.asarray([1.0]), "fp16")
