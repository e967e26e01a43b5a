"""Philox4x32-10, the counter-based generator behind stochastic rounding.

Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC11), as in
Random123 and cuRAND. This is the NumPy backend's implementation: elementwise uint64 ops
(64-bit products for the multiply-high, xor, masks), checked against Random123's published
known-answer vectors. Not every array library has those ops (torch's uint32/uint64 have only
``& | ^ == !=``); ``fpsim.rounding.portable`` computes the same bits on any backend's array
namespace with signed 64-bit integers and 16-bit partial products, none of which overflow.

Layout used by ``philox_uniforms``: key = (seed & 0xFFFFFFFF, seed >> 32); the counter of
element i is (c0, c1, c2, c3) = (low 32 bits of offset + i, high 32 bits of offset + i, 0, 0).
Its first two output words make one uniform with 53 bits:
u = (((w0 << 32) | w1) >> 11) * 2**-53, in [0, 1) and exact in float64.
"""
from __future__ import annotations

import numpy as np

from ..options import check_count, check_count_between

__all__ = ["philox4x32", "philox_uniforms"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
ROUNDS = 10
SEED_MAX = 2**64 - 1     # seeds (keys) and offsets (counters) are 64-bit words


def philox4x32(counter, key, rounds: int = ROUNDS):
    """Philox4x32-``rounds`` of four uint32 counter words (arrays of one shape) under two
    uint32 key words; returns the four output words as uint32 arrays."""
    c0, c1, c2, c3 = (np.array(c, np.uint64) for c in counter)
    return tuple(w.astype(np.uint32) for w in _rounds(c0, c1, c2, c3, key, rounds))


def _rounds(c0, c1, c2, c3, key, rounds):
    # Words are held in uint64 arrays (values below 2**32), so the 64-bit products need no
    # conversion; every op is in place on the caller's arrays.
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        c0 *= _M0                      # c0 becomes the product hi0:lo0
        c2 *= _M1                      # c2 becomes hi1:lo1
        c1 ^= c2 >> _32                # new c0 = hi1 ^ c1 ^ k0
        c1 ^= np.uint64(k0)
        c3 ^= c0 >> _32                # new c2 = hi0 ^ c3 ^ k1
        c3 ^= np.uint64(k1)
        c0 &= _LOW                     # lo0: the new c3
        c2 &= _LOW                     # lo1: the new c1
        c0, c1, c2, c3 = c1, c2, c3, c0
    return c0, c1, c2, c3


def check_counters(seed, offset, n) -> tuple[int, int, int]:
    """``philox_uniforms``' arguments as Python ints (seed and offset in [0, 2**64), n >= 0
    with ``offset + n <= 2**64``), or a TypeError / ValueError; shared with the portable
    draw."""
    seed = check_count_between("seed", seed, 0, SEED_MAX)
    offset = check_count_between("offset", offset, 0, SEED_MAX)
    n = check_count("n", n, 0)
    if offset + n > 2**64:
        raise ValueError(f"counters offset..offset+n-1 must stay below 2**64 "
                         f"(offset={offset}, n={n})")
    return seed, offset, n


def philox_uniforms(seed: int, offset: int, n: int) -> np.ndarray:
    """``n`` float64 uniforms in [0, 1): element i is drawn from counter ``offset + i`` under
    key ``seed`` (layout in the module docstring), so any slice of a long stream can be drawn
    on its own. ``offset + n`` must not pass 2**64.

    >>> philox_uniforms(0, 0, 3).tolist() == philox_uniforms(0, 0, 5)[:3].tolist()
    True
    """
    seed, offset, n = check_counters(seed, offset, n)
    index = np.arange(n, dtype=np.uint64)
    index += np.uint64(offset)
    high = index >> _32
    index &= _LOW
    w0, w1, _, _ = _rounds(index, high, np.zeros(n, np.uint64), np.zeros(n, np.uint64),
                           (seed & 0xFFFFFFFF, seed >> 32), ROUNDS)
    w0 <<= _32
    w0 |= w1
    w0 >>= np.uint64(11)
    return w0.astype(np.float64) * 2.0**-53
