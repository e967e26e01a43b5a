"""Hard cases for correct rounding, generated (not sampled): inputs whose exact result lies
within a few float64 ulps of a rounding boundary of the output format.

Round-to-nearest into a format changes its result only at the format's midpoints (the
overflow threshold, the midpoint above the largest value, among them). A float64 evaluation
within ~2**-50 of the exact value cannot decide the rounding of a result that close to a
midpoint, so these inputs go to the Decimal fallback, which is where a misrounding would
hide. (Beside a format number, in contrast, every value rounds to that number.)

Two ways to find them:
- search: run the float64 evaluation over a deterministic candidate set and keep the inputs
  whose value is closest to a midpoint (``closest_to_midpoints``);
- construction: families whose exact result is a midpoint moved by far less than a
  float64 ulp (x a midpoint and tanh x = x - x**3/3 ...; a softmax row whose log-softmax is
  a midpoint minus log(1 + t) with t below 2**-53, ...).
"""
from __future__ import annotations

import numpy as np

from fpsim.formats import Format


def few_bit_floats(bits: int, low: int, high: int) -> np.ndarray:
    """Every positive float32 with at most ``bits`` significant bits in [2**low, 2**high):
    a set that holds every midpoint and number of each format of fewer than ``bits`` bits,
    and the families x = (2k + 1) 2**e with k < 2**(bits - 1)."""
    significands = np.arange(1 << (bits - 1), 1 << bits, dtype=np.float64)
    exps = np.arange(low - bits + 1, high - bits + 1, dtype=np.float64)
    values = (significands[None, :] * np.exp2(exps)[:, None]).ravel()
    keep = values >= 2.0 ** -149
    return np.unique(values[keep].astype(np.float32))


def float32_run(centre: float, count: int) -> np.ndarray:
    """``count`` consecutive float32 values around ``centre`` (by bit pattern; centre > 0)."""
    mid = int(np.float32(centre).view(np.uint32))
    bits = np.arange(mid - count // 2, mid + count - count // 2, dtype=np.uint32)
    return bits.view(np.float32)


def midpoint_distance(v: np.ndarray, fmt: Format) -> np.ndarray:
    """|v - m| / |v| for m the midpoint of ``fmt``'s grid nearest float64 v (between two
    format numbers, or above the largest: the overflow threshold); inf where v is zero or not
    finite."""
    v = np.asarray(v, np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        _, exp = np.frexp(np.abs(v))
        quantum = np.exp2(np.maximum(exp - 1, fmt.emin) - fmt.man_bits)
        nearest = (np.floor(v / quantum) + 0.5) * quantum
        distance = np.abs(v - nearest) / np.abs(v)
    return np.where(np.isfinite(v) & (v != 0), distance, np.inf)


def closest_to_midpoints(x: np.ndarray, values: np.ndarray, fmt: Format, count: int):
    """The ``count`` elements of x whose ``values`` lie closest to a midpoint of ``fmt``
    (stable order: ties go to the earlier element, so the choice is deterministic)."""
    distance = midpoint_distance(values, fmt)
    order = np.argsort(distance, kind="stable")[:count]
    return np.sort(x[order[np.isfinite(distance[order])]])


def tiny_midpoint_inputs(fmt: Format, low: int = -149, high: int = -26) -> np.ndarray:
    """Positive float32 in [2**low, 2**high) that are midpoints of ``fmt``'s grid (subnormal
    midpoints included) and not float32 ties themselves: tanh x, gelu 2x and x/(1+x...) sit
    just beside them, by a relative x**2 / 3 that no float64 evaluation resolves."""
    if fmt.precision + 1 > 24:
        return np.zeros(0, np.float32)            # no float32 is a midpoint of fp32
    candidates = few_bit_floats(fmt.precision + 1, low, high).astype(np.float64)
    quantum = np.exp2(np.maximum(np.floor(np.log2(candidates)), fmt.emin) - fmt.man_bits)
    is_midpoint = np.mod(candidates / quantum, 1.0) == 0.5
    return candidates[is_midpoint].astype(np.float32)


def log_softmax_midpoint_rows(fmt: Format, count: int = 64, others: int = 0) -> np.ndarray:
    """Rows [s, -D, (-D - 1 - j for j < others)] whose log-softmax at column 1 is
    -(D + s) - log(1 + t): D + s = M, up to ``count`` midpoints M of ``fmt`` in [40, 64)
    (D = floor M, s = M - D, both float32), t <= (others + 1) e**-40 far below 2**-53 M.
    The same value negated is the cross-entropy of label 1. Each row also comes with its
    maximum last (the column order must not matter)."""
    ulp = 2.0 ** (5 - fmt.man_bits)                     # fmt's spacing in [32, 64)
    k = np.unique(np.linspace(8 / ulp, 32 / ulp - 1, count).astype(np.int64))
    midpoints = 32 + (k + 0.5) * ulp
    rows = []
    for gap, s in zip(np.floor(midpoints), midpoints - np.floor(midpoints)):
        tail = [-gap - 1.0 - j for j in range(others)]
        rows += [[s, -gap] + tail, [-gap] + tail + [s]]
    return np.array(rows, np.float32)


def sigmoid_midpoint_offsets(count: int = 128) -> np.ndarray:
    """d = (2k + 1) 2**-23, k < count: sigmoid(d) = 1/2 + d/4 - d**3/48 + ... lies just below
    fp32's midpoint 1/2 + (2k + 1) 2**-25 (the issue's sigmoid and 2-class softmax family)."""
    return ((2 * np.arange(count) + 1) * 2.0 ** -23).astype(np.float32)
