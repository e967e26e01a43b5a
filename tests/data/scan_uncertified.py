"""Scan every float32 input of exp, log, tanh, sigmoid and gelu for the ones whose float64
certificate (``fpsim.exact.correctly_rounded.certified``) cannot decide the rounding into
fp32, fp16, bf16 or e4m3fn: the inputs that go to the Decimal fallback. Writes
``cr_uncertified.npz`` beside this file (one uint32 array of float32 bit patterns per
function and format, key "name/format"), which ``tests/test_cr_uncertified.py`` checks
against MPFR. Every pattern but inf and NaN is scanned (NaN and inf are decided as they
stand). About 40 minutes of one core:

    python tests/data/scan_uncertified.py [--functions exp,log] [--out PATH]

Rerun it after a change to ``fpsim.exact.elementary`` or to the certificate (the test then
fails on a sample until the file is regenerated).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from fpsim.exact import correctly_rounded as cr, elementary as el
from fpsim.formats import get

FORMATS = ("fp32", "fp16", "bf16", "e4m3fn")
FUNCTIONS = {"exp": (el.exp, lambda x: el.EXP_BOUND), "log": (el.log, lambda x: el.LOG_BOUND),
             "tanh": (el.tanh, lambda x: el.TANH_BOUND),
             "sigmoid": (el.sigmoid, lambda x: el.SIGMOID_BOUND),
             "gelu": (el.gelu, cr.gelu_bound)}
CHUNK = 1 << 22


def uncertified(name: str, bits: np.ndarray) -> dict[str, np.ndarray]:
    """The patterns among ``bits`` (finite float32) that each format's certificate leaves."""
    evaluate, bound = FUNCTIONS[name]
    x = bits.view(np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        v = evaluate(x)
        b = bound(x)
        return {fmt: bits[~cr.certified(v, b, get(fmt))] for fmt in FORMATS}


def scan(name: str) -> dict[str, np.ndarray]:
    found = {fmt: [] for fmt in FORMATS}
    start = time.time()
    for sign in (0, 0x80000000):
        for low in range(0, 0x7F800000, CHUNK):          # finite patterns of one sign
            bits = np.arange(low, min(low + CHUNK, 0x7F800000), dtype=np.uint32) | sign
            for fmt, hard in uncertified(name, bits).items():
                found[fmt].append(hard)
        print(f"{name}: sign {sign >> 31} done, {time.time() - start:.0f} s", file=sys.stderr)
    return {fmt: np.concatenate(parts) for fmt, parts in found.items()}


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--out", default=os.path.join(here, "cr_uncertified.npz"))
    args = parser.parse_args(argv)
    names = args.functions.split(",")
    unknown = sorted(set(names) - set(FUNCTIONS))
    if unknown:
        parser.error(f"unknown function(s) {unknown}; known: {sorted(FUNCTIONS)}")
    arrays = {}
    if os.path.exists(args.out):                          # keep the functions not rescanned
        with np.load(args.out) as old:
            arrays = {k: old[k] for k in old.files if k.split("/")[0] not in names}
    for name in names:
        for fmt, hard in scan(name).items():
            arrays[f"{name}/{fmt}"] = hard
            print(f"{name} -> {fmt}: {hard.size} uncertified", file=sys.stderr)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(args.out), suffix=".npz")
    os.close(fd)
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, args.out)                             # atomic: never a half-written file
    return 0


if __name__ == "__main__":
    sys.exit(main())
