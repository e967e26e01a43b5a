"""Every float32 input whose float64 certificate fails, through the Decimal fallback, against
MPFR: so exp, log, tanh, sigmoid and gelu are correctly rounded into fp32, fp16, bf16 and
e4m3fn for *every* float32 input (the certified ones by the certificate's proof, checked on
random inputs in ``test_transcendentals``; the others here, each one).

``tests/data/cr_uncertified.npz`` lists them, found by ``tests/data/scan_uncertified.py``
over all 2**32 - 2**24 finite patterns (about 40 minutes). The file is validated before use,
and a rescan of slices of the pattern space must find exactly the listed inputs there: a
change to ``elementary`` or to the certificate that moves the set fails here until the file
is regenerated.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

gmpy2 = pytest.importorskip("gmpy2")

import fpsim.exact as fx  # noqa: E402
from fpsim.formats import get  # noqa: E402
from fpsim.rounding import round_to  # noqa: E402
from mpfr_oracle import function_values, mpfr_rounded  # noqa: E402

DATA = pathlib.Path(__file__).with_name("data")
sys.path.insert(0, str(DATA))
import scan_uncertified as scan  # noqa: E402

NAMES = tuple(scan.FUNCTIONS)
CR = {"exp": fx.cr_exp, "log": fx.cr_log, "tanh": fx.cr_tanh, "sigmoid": fx.cr_sigmoid,
      "gelu": fx.cr_gelu}


def _load() -> dict[str, np.ndarray]:
    """The listed inputs, validated: one sorted, duplicate-free uint32 array of finite
    float32 patterns per function and format, and nothing else."""
    with np.load(DATA / "cr_uncertified.npz", allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    expected = {f"{n}/{f}" for n in NAMES for f in scan.FORMATS}
    assert set(arrays) == expected, f"keys {sorted(set(arrays) ^ expected)} (in one only)"
    for key, bits in arrays.items():
        assert bits.dtype == np.uint32 and bits.ndim == 1, key
        assert (np.diff(bits.astype(np.int64)) > 0).all() if bits.size > 1 else True, key
        assert ((bits & 0x7F800000) != 0x7F800000).all(), f"{key}: inf or NaN listed"
    return arrays


LISTED = _load()


@pytest.mark.parametrize("name", NAMES)
def test_every_uncertified_input_settles_to_the_mpfr_rounding(name):
    for fmt in scan.FORMATS:
        bits = LISTED[f"{name}/{fmt}"]
        if bits.size == 0:
            continue
        x = bits.view(np.float32)
        before = fx.FALLBACK_COUNT["elements"]
        got = round_to(CR[name](x, get(fmt)), get(fmt)).astype(np.float32)
        assert fx.FALLBACK_COUNT["elements"] - before == x.size, f"{name}/{fmt}: not all settled"
        want = mpfr_rounded(function_values(name, x, 400), fmt)
        wrong = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert wrong.size == 0, (f"{name} -> {fmt}: {wrong.size} of {x.size} differ at "
                                 f"{x[wrong[:4]].tolist()}")


def _slices():
    """Pattern ranges rescanned: around the first and last listed input of each function
    (where the certificate is known to fail) and four fixed ranges across both signs."""
    starts = {0x00000000, 0x3F800000 - (1 << 17), 0x80400000, 0xC1200000}
    for name in NAMES:
        every = np.concatenate([LISTED[f"{name}/{f}"] for f in scan.FORMATS])
        if every.size:
            starts |= {int(every.min()) & ~0xFFFF, int(every.max()) & ~0xFFFF}
    return sorted(starts)


@pytest.mark.parametrize("name", NAMES)
def test_the_list_is_what_the_certificate_leaves_today(name):
    for start in _slices():
        bits = np.arange(start, start + (1 << 18), dtype=np.uint64)
        bits = bits[(bits < 2 ** 32)].astype(np.uint32)
        bits = bits[(bits & 0x7F800000) != 0x7F800000]
        found = scan.uncertified(name, bits)
        for fmt in scan.FORMATS:
            listed = LISTED[f"{name}/{fmt}"]
            listed = listed[(listed >= bits[0]) & (listed <= bits[-1])]
            assert np.array_equal(found[fmt], listed), (
                f"{name}/{fmt} in [{start:#010x}, +2**18): the certificate now leaves "
                f"{found[fmt].size} inputs, the list has {listed.size}; rerun "
                f"tests/data/scan_uncertified.py")
