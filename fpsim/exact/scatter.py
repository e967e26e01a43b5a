"""Scatter-add with exact totals: the gradient of a gather whose indices repeat (an embedding
lookup, ``x[[0, 2, 0]]``).

``scatter_sum(positions, values, size)`` gives, for each target position, the exact sum of the
values sent to it rounded to odd at 53 bits (``sums.round_to_odd_sum``), so one more rounding
to any format of at most 51 significand bits is the correctly rounded total; positions that
receive nothing are +0. The result does not depend on the order of the values, so no atomics
and no sequential loop are needed for the same bits on every array library (NumPy's
``add.at`` adds in index order, one float64 rounding per addition).

How: a stable sort groups the values by target; groups of equal length form dense
(count, length) matrices, summed row by row without padding. A zero total is +0, as a sum
that starts from +0 gives (``0.0 + -0.0`` is +0). A group holding inf or NaN is added in index
order in float64 (IEEE: the class of the result, inf or NaN, does not depend on the order).

>>> import numpy as np
>>> scatter_sum(np.array([2, 0, 2]), np.array([1.0, 5.0, 2.0 ** -60]), 3).tolist() == [
...     5.0, 0.0, 1.0 + 2.0 ** -52]                       # 1 + 2**-60 rounded to odd
True
"""
from __future__ import annotations

from ..backend import to_list, xp

from .sums import round_to_odd_sum

__all__ = ["scatter_sum"]


def scatter_sum(positions: xp.ndarray, values: xp.ndarray, size: int) -> xp.ndarray:
    """Float64 array of ``size``: at each position, the exact sum of the ``values`` whose
    ``positions`` name it, rounded to odd at 53 bits; +0 where none does."""
    positions = xp.reshape(xp.asarray(positions, xp.int64), (-1,))
    values = xp.reshape(xp.asarray(values, xp.float64), (-1,))
    if positions.shape != values.shape:
        raise ValueError(f"scatter_sum: {positions.shape[0]} positions for "
                         f"{values.shape[0]} values")
    out = xp.zeros(size, xp.float64)
    if positions.shape[0] == 0:
        return out
    order = xp.argsort(positions, kind="stable")          # index order within each target
    targets, starts, counts = xp.unique(positions[order], return_index=True,
                                        return_counts=True)
    grouped = values[order]
    for length in to_list(xp.unique(counts)):
        chosen = counts == length
        if length == 1:     # one value: its own exact sum (max pooling's usual case)
            out[targets[chosen]] = grouped[starts[chosen]] + 0.0          # -0 -> +0
            continue
        rows = grouped[starts[chosen][:, None] + xp.arange(length)]    # (count, length)
        finite = xp.all(xp.isfinite(rows), axis=1)
        totals = xp.empty(rows.shape[0], xp.float64)
        if xp.any(finite):
            totals[finite] = round_to_odd_sum(rows[finite])
        if not xp.all(finite):
            with xp.errstate(invalid="ignore", over="ignore"):
                totals[~finite] = xp.cumsum(rows[~finite], axis=1)[:, -1]
        out[targets[chosen]] = totals + 0.0                 # -0 -> +0, as a sum from +0
    return out
