"""im2col for ``conv2d`` (``ops_conv``): one band of a convolution's columns, unfolded from
its source without a padded or zero-stuffed copy (``Unfolding``, ``unfold``).
"""
from __future__ import annotations

from typing import NamedTuple

from ..backend import fused, xp

__all__ = ["Unfolding", "unfold"]


class Unfolding(NamedTuple):
    """How a convolution's output positions read its source (N, C, Hs, Ws), per axis (rows,
    columns): at output position p, kernel tap i meets the virtual position v = p stride + i
    dilation - offset, which holds source element v / spread where that is a whole number in
    [0, Hs), and a zero elsewhere (the padding, or the zeros between a strided gradient's
    elements). The forward pass and dW read x (offset = padding, spread 1); dx reads g
    (stride 1, offset d (k-1) - padding, spread = the forward stride). No padded or
    zero-stuffed copy of the source is made: each band's columns take the part that lands on
    the source and keep zeros elsewhere."""

    kernel: tuple
    stride: tuple
    dilation: tuple
    offset: tuple
    spread: tuple


def _span(lo, hi, tap, stride, spread, offset, size):
    """The output positions p in [lo, hi) whose virtual position p stride + tap - offset
    lands on a source element (``Unfolding``): (their slice in the band, counted from lo;
    the source elements' slice), or None. One of stride and spread is 1."""
    base = tap - offset
    if spread == 1:
        first = max(lo, -(base // stride))                  # ceil(-base / stride)
        last = min(hi - 1, (size - 1 - base) // stride)
        if last < first:
            return None
        start = first * stride + base
        return (slice(first - lo, last - lo + 1),
                slice(start, start + stride * (last - first) + 1, stride))
    first = max(lo, -base)
    first += -(first + base) % spread                       # the next multiple of spread
    last = min(hi - 1, spread * (size - 1) - base)
    if last < first:
        return None
    count = (last - first) // spread + 1
    start = (first + base) // spread
    return (slice(first - lo, first - lo + spread * (count - 1) + 1, spread),
            slice(start, start + count))


def unfold(source, how, batch, rows, width, first, stop, *, column_major=False):
    """im2col of one band: (m len(rows) width, stop - first) columns, row (sample, output
    row, output column), column f in [first, stop) of the (c, i, j) order (f = c kh kw + i kw
    + j): the source value channel c, kernel tap (i, j) meets there, or zero.
    ``column_major``: each column contiguous (the transpose of a C-ordered array), so the
    product's column norms are the rows' BLAS dot products (``fast_matmul``), and each tap
    is written as whole rows of the source (row-major columns take every tap's channels
    ``kh kw`` elements apart: measured 1.5-2x slower). The forward pass and dx take it too,
    but in the float64 reference mode (its BLAS products' bits may depend on the layout).
    Where the backend offers a fused ``unfold`` (``fpsim.backend.fused``), that builds it
    (the same array); the code below is the reference."""
    compiled = fused("unfold")
    if compiled is not None and batch.step in (None, 1) and rows.step == 1:
        start, end, _ = batch.indices(source.shape[0])
        columns = compiled(source, tuple(how.kernel), tuple(how.stride), tuple(how.dilation),
                         tuple(how.offset), tuple(how.spread), start, end, rows.start,
                         rows.stop, width, first, stop, column_major)
        if columns is not None:
            return columns
    part = source[batch]
    size_h, size_w = part.shape[2:]
    (kh, kw), taps = how.kernel, how.kernel[0] * how.kernel[1]
    shape = (part.shape[0], len(rows), width)
    if column_major:
        stored = xp.zeros((stop - first,) + shape, source.dtype)
        columns = xp.transpose(stored, (1, 2, 3, 0))      # a view: writes go to stored
    else:
        stored = columns = xp.zeros(shape + (stop - first,), source.dtype)
    for i in range(kh):
        down = _span(rows.start, rows.stop, i * how.dilation[0], how.stride[0],
                     how.spread[0], how.offset[0], size_h)
        if down is None:
            continue
        for j in range(kw):
            across = _span(0, width, j * how.dilation[1], how.stride[1], how.spread[1],
                           how.offset[1], size_w)
            tap = i * kw + j
            low = max(0, -((tap - first) // taps))          # channels with f in the band
            high = min(part.shape[1], (stop - 1 - tap) // taps + 1)
            if across is None or high <= low:
                continue
            start = low * taps + tap - first
            window = part[:, low:high, down[1], across[1]]
            columns[:, down[0], across[0], start:start + taps * (high - low - 1) + 1:taps] = (
                xp.transpose(window, (0, 2, 3, 1)))
    if column_major:
        return xp.reshape(stored, (stop - first, -1)).T
    return xp.reshape(stored, (-1, stop - first))
