"""The ``blocked`` model: multi-term fused additions, as in NVIDIA tensor cores.

One block (``block_step``) computes d = c + p_1 + ... + p_k, the p_i exact products and c the
running accumulator (a value of ``fmt``), then rounds d once to ``fmt``. With
``alignment_bits=None`` the sum is exact. With ``alignment_bits=F`` the block follows the
model of Fasi, Higham, Mikaitis & Pranesh, "Numerical behavior of NVIDIA tensor cores",
PeerJ Computer Science 7:e330 (2021), sections on the V100, T4 and A100 tensor cores, in the
parameterised form of the authors' MATLAB models (north-numerical-computing/MATLAB-tensor-core:
models/tools/Generic_BFMA_TC.m and V100TC.m / A100TC.m / H100TC.m)::

    e(x) = max(floor(log2|x|), emin of x's format)     # subnormals read at the minimum exponent
    exponent of a product a*b: e(a) + e(b)              # significand in [0, 4): 2 carry bits
    exponent of c: e(c) in fmt
    E = max exponent over the nonzero terms of the block
    each term t -> sign(t) * floor(|t| / 2**(E - F)) * 2**(E - F)   # align, truncate bits
    d = round(sum of the truncated terms, fmt, rounding)            # the sum itself is exact

Presets: V100 k=4, F=23 (no extra bits: FHMP's "no guard digits"), A100 k=8, F=24,
H100 k=16, F=25 (the MATLAB models' neab = 0, 1, 2 extra alignment bits over fp32's 23);
final rounding toward zero into fp32 (FHMP: round-down of positive, round-up of negative
results) and to nearest even into fp16.

Modelled: exact products, alignment to the largest exponent with truncation, the extra
alignment bits, carry bits (the sum of the truncated terms is exact, so no carry is ever
lost), the block size, inputs' subnormals read at their format's minimum exponent, the final
rounding mode, blocks in index order with recursive accumulation between blocks (as the
MATLAB GEMM does). Not modelled: the order inside the hardware's k x k tiles beyond "blocks
of consecutive k", H100/B200 fp8 paths (interleaving, negative extra bits), the exponent
limits of the later MATLAB models (min_exp_limit), flush-to-zero modes, and overflow: a
block sum past ``fmt``'s range follows round_to's IEEE rule for the rounding mode (toward
zero gives the largest finite value), which the hardware may not do. Zero sums are +0 unless
every truncated term is -0 (IEEE addition of the terms).
"""
from __future__ import annotations

from ..backend import astype, copy, round_to, xp
from ..formats import FP32
from .certificate import certify, width_factor
from .sums import round_to_odd_sum

_NO_EXPONENT = -xp.inf


def exponents(x: xp.ndarray, emin: int) -> xp.ndarray:
    """max(floor(log2|x|), emin) as float64; -inf for zeros and non-finite values."""
    with xp.errstate(invalid="ignore"):
        e = xp.maximum(astype(xp.frexp(x)[1], xp.float64) - 1, emin)
        return xp.where((x == 0) | ~xp.isfinite(x), _NO_EXPONENT, e)


def block_step(acc: xp.ndarray, terms: list, term_exps: list, model) -> xp.ndarray:
    """One block on float64 arrays of one shape: acc (values of fmt), k terms with their
    alignment exponents. Returns the new accumulator (float64 values of fmt)."""
    fmt = model.fmt
    with xp.errstate(invalid="ignore", over="ignore"):
        special = xp.where(xp.isfinite(acc), 0.0, acc)
        for t in terms:
            special = special + xp.where(xp.isfinite(t), 0.0, t)  # IEEE: NaN, +-inf, +inf-inf
        acc_f = xp.where(xp.isfinite(acc), acc, 0.0)
        finite_terms = [xp.where(xp.isfinite(t), t, 0.0) for t in terms]
    if model.alignment_bits is None:
        rounded = _exact_block(acc_f, finite_terms, fmt, model.rounding)
    else:
        largest = exponents(acc_f, fmt.emin)
        for e in term_exps:
            largest = xp.maximum(largest, e)
        largest = xp.where(largest == _NO_EXPONENT, 0.0, largest)  # an all-zero block
        quantum = xp.ldexp(1.0, astype(largest - model.alignment_bits, xp.int64))
        total = _aligned_sum([acc_f] + finite_terms, quantum, model.alignment_bits)
        with xp.errstate(over="ignore", invalid="ignore"):
            rounded = round_to(total, fmt, model.rounding)
    return xp.where(xp.isfinite(special), rounded, special)


def _aligned_sum(cells: list, quantum: xp.ndarray, bits: int) -> xp.ndarray:
    """The sum of the cells truncated to multiples of ``quantum``, exact, or rounded to odd
    at 53 bits where float64 cannot hold it (rounding once more to the block's format then
    gives the rounding of the exact sum).

    Each truncated cell is an integer multiple of quantum below 2**(bits + 2) of them (a
    product's significand is below 4, the accumulator's below 2), so float64 adds
    ``2**(51 - bits)`` of them exactly (every partial sum is an integer below 2**53): one
    group for ``k + 1 <= 2**(51 - bits)``, e.g. every preset. More cells (a large k with
    many alignment bits) are added in such groups, and the groups by ``round_to_odd_sum``.
    Zeros: IEEE addition within a group; -0 only if every cell is -0 either way.
    """
    group = 1 << (51 - bits)
    parts: list = []
    for i, cell in enumerate(cells):
        cut = xp.trunc(cell / quantum) * quantum
        if i % group:
            parts[-1] = parts[-1] + cut
        else:
            parts.append(cut)
    if len(parts) == 1:
        return parts[0]
    stacked = xp.stack(xp.broadcast_arrays(*parts), axis=-1)
    return xp.reshape(round_to_odd_sum(xp.reshape(stacked, (-1, len(parts)))),
                      stacked.shape[:-1])


def _exact_block(acc: xp.ndarray, terms: list, fmt, mode: str) -> xp.ndarray:
    """round(acc + sum(terms), fmt, mode) of the exact sum, finite float64 inputs.

    As in the exact model: the interval certificate (``certificate``, N = the float64 sum of
    |acc| and |t|; every rounding mode is monotonic), else the exact integer-limb sum rounded
    to odd, then rounded once.
    A sum of zeros comes out of float64 addition with IEEE's sign (-0 only if all are -0).
    """
    total, magnitude = copy(acc), xp.abs(acc)
    for t in terms:
        total += t
        magnitude += xp.abs(t)
    _, rounded, certified = certify(total, magnitude * width_factor(len(terms) + 1),
                                    round_end=lambda x: round_to(x, fmt, mode))
    todo = ~certified
    if xp.any(todo):
        stacked = xp.stack([acc[todo]] + [xp.broadcast_to(t, acc.shape)[todo] for t in terms],
                           axis=-1)
        with xp.errstate(over="ignore", invalid="ignore"):
            rounded[todo] = round_to(round_to_odd_sum(stacked), fmt, mode)
    return rounded


def _input_emin(model) -> int:
    return (model.input_format or FP32).emin


def blocked_matmul(a64: xp.ndarray, b64: xp.ndarray, model) -> xp.ndarray:
    """(nb, M, K) @ (nb, K, N) float64 (float32 values) under a ``blocked`` model."""
    nb, m, k = a64.shape
    n = b64.shape[2]
    emin = _input_emin(model)
    ea, eb = exponents(a64, emin), exponents(b64, emin)
    acc = xp.zeros((nb, m, n), xp.float64)
    with xp.errstate(invalid="ignore"):
        for start in range(0, k, model.k):
            idx = range(start, min(start + model.k, k))
            terms = [a64[:, :, i, None] * b64[:, None, i, :] for i in idx]
            exps = [ea[:, :, i, None] + eb[:, None, i, :] for i in idx]
            acc = block_step(acc, terms, exps, model)
    return acc


def blocked_rows(x64: xp.ndarray, model) -> xp.ndarray:
    """Row sums of a (n, K) float64 array (float32 values) under a ``blocked`` model."""
    rows, k = x64.shape
    ex = exponents(x64, _input_emin(model))
    acc = xp.zeros(rows, xp.float64)
    for start in range(0, k, model.k):
        idx = range(start, min(start + model.k, k))
        acc = block_step(acc, [x64[:, i] for i in idx], [ex[:, i] for i in idx], model)
    return acc


def block_fma(c: xp.ndarray, a: xp.ndarray, b: xp.ndarray, model) -> xp.ndarray:
    """d = c + sum(a * b, axis=-1) for one block; float32 in (c in fmt), float32 out."""
    for name, x in (("c", c), ("a", a), ("b", b)):
        if x.dtype != xp.float32:
            raise TypeError(f"block_fma: {name} must be float32, got {x.dtype}")
    a, b = xp.broadcast_arrays(a, b)
    if a.ndim == 0 or a.shape[-1] > model.k:
        raise ValueError(f"block_fma: the last axis holds the block's products and must have "
                         f"1..{model.k} entries, got shape {tuple(a.shape)}")
    shape = xp.broadcast_shapes(c.shape, a.shape[:-1])
    a64, b64 = astype(a, xp.float64), astype(b, xp.float64)
    emin = _input_emin(model)
    ea, eb = exponents(a64, emin), exponents(b64, emin)
    with xp.errstate(invalid="ignore"):
        terms = [xp.broadcast_to(a64[..., i] * b64[..., i], shape) for i in range(a.shape[-1])]
    exps = [xp.broadcast_to(ea[..., i] + eb[..., i], shape) for i in range(a.shape[-1])]
    acc = xp.broadcast_to(astype(c, xp.float64), shape)
    return astype(block_step(acc, terms, exps, model), xp.float32)
