"""Operands of the certified products (``fast_matmul``) widened to float64 with their
norms and, optionally, their lines' quanta, in the products' reused work arrays
(``work_array``).
"""
from __future__ import annotations

import math

from ..backend import fused, is_contiguous, scratch, tuning, xp
from .certificate import lowest_bit_patterns, quanta_from_patterns

__all__ = ["widen_with_norms", "work_array"]


def work_array(name: str, shape: tuple, dtype) -> xp.ndarray:
    """A reused per-thread work array: ``round_to``'s per-thread buffers (fresh large arrays
    cost page faults on every call), under names of their own."""
    return xp.reshape(scratch(name, dtype, math.prod(shape)), shape)


def widen_with_norms(x: xp.ndarray, name: str, axis: int, quanta: bool = False):
    """(x in float64, exact, in a reused buffer (``work_array``) with x's memory order (BLAS reads
    either); the 2-norms in float64 over ``axis``; with ``quanta``, the lines' ``line_quanta`` over
    ``axis``, else None), chunk by chunk along x's memory order, so that the norms and the quanta
    read the values while they are in cache (without quanta, larger chunks: the copy and the norms
    alone run faster so on large operands). A norm's sum runs in some order (in partial sums per
    chunk where a line crosses chunks); the (K/2 + 2) u bound on its error
    (``cauchy_schwarz_bound``) holds for every order; the quanta's minimum is one
    (``lowest_bit_patterns`` per chunk, combined). Chunk sizes: ``tuning().widen_chunk`` elements
    with quanta, ``plain_factor`` times more without. A backend's fused kernel, where offered,
    fills the same buffer with the same copy and gives the sums of squares (in its own order)
    and the same patterns in compiled loops instead of the chunks."""
    if is_contiguous(x, "F") and not is_contiguous(x, "C"):
        src, along_rows = x.T, axis == 0                # src is C-ordered
        wide = work_array(name, src.shape, xp.float64)
        out = wide.T
    else:
        src, along_rows = x, axis == 1
        wide = out = work_array(name, x.shape, xp.float64)
    kernel = fused("widen_with_norms")
    found = None if kernel is None else kernel(x, out, axis, quanta)
    if found is None:                                   # none offered, or x declined
        found = _widen_in_chunks(src, wide, along_rows, quanta)
    squares, patterns = found
    norms = xp.sqrt(squares, out=squares)
    return out, norms, None if patterns is None else quanta_from_patterns(patterns)


def _widen_in_chunks(src: xp.ndarray, wide: xp.ndarray, along_rows: bool, quanta: bool):
    """``widen_with_norms``' (squares, patterns or None) on the namespace: ``src`` copied into
    ``wide`` (both in src's orientation, wide C-ordered) chunk by chunk of lines, the sums of
    squares along rows (``along_rows``) or columns."""
    settings = tuning()
    lines, width = src.shape
    step = max(1, settings.widen_chunk * (1 if quanta else settings.plain_factor)
               // max(1, width))
    across = 1 if along_rows else 0
    if step >= lines:                                   # one chunk
        xp.copyto(wide, src)
        squares = (_row_squares(wide, settings.dot_from) if along_rows
                   else xp.einsum("pq,pq->q", wide, wide))
        patterns = lowest_bit_patterns(src, across) if quanta else None
    else:
        squares = xp.empty(lines, xp.float64) if along_rows else xp.zeros(width, xp.float64)
        patterns = xp.empty(lines, xp.int32) if quanta and along_rows else None
        for lo in range(0, lines, step):
            part = wide[lo:lo + step]
            xp.copyto(part, src[lo:lo + step])
            if along_rows:
                _row_squares(part, settings.dot_from, squares[lo:lo + step])
            else:
                squares += xp.einsum("pq,pq->q", part, part)
            if not quanta:
                continue
            found = lowest_bit_patterns(src[lo:lo + step], across)
            if along_rows:
                patterns[lo:lo + step] = found
            elif patterns is None:
                patterns = found
            else:
                xp.minimum(patterns, found, out=patterns)
    return squares, patterns


def _row_squares(x: xp.ndarray, dot_from: int, out: xp.ndarray | None = None) -> xp.ndarray:
    """Each row's sum of squares of the C-ordered float64 x, as a stack of 1 x K by K x 1
    matrix products (BLAS dot products: about twice as fast as einsum's loop for long
    rows, slower below ``dot_from`` elements (``tuning().dot_from``); any summation order
    keeps the norms' bound)."""
    if x.shape[1] < dot_from:
        return xp.einsum("pq,pq->p", x, x, out=out)
    # views by indexing, not reshape calls: out[:, None, None] writes into out
    into = None if out is None else out[:, None, None]
    return xp.matmul(x[:, None, :], x[:, :, None], out=into)[:, 0, 0]
