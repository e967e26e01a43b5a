"""The exact model's fast products (2-D, batched): one float64 BLAS product, certified per element.

``matmul_2d(a, b, out_fmt, bias)`` returns the same bits as the general path
(``certified.exact_matmul`` with ``acc = fp32``, then ``+ bias`` in float32, then one rounding
to ``out_fmt``), for a 2-D float32 ``a`` (M, K) and ``b`` (K, N) with finite values. Writing
``rnd32`` for fp32 nearest-even rounding, ``pre(x) = fl32(x + bias_j)`` (or ``x`` without a bias)
and ``f = rnd_out o pre``, the result is ``f(rnd32(s))`` with ``s`` the exact dot product::

    approx = fl64(a @ b)                                  # any BLAS, order, threads
    exact rows (where taken, below): acc = fl32(approx); approx = +-0: the IEEE zero sum
    other rows:
      w      = max(||a_i|| c, 2**-600) max(||b_j||, 2**-400),  c = width_factor(K)
             = ||a_i|| ||b_j|| (h + 2**-50) (1 + 2h) (1 + 2**-39) but for all-zero lines,
               h = K 2**-53 (1 + K 2**-52)
      lo32, hi32 = fl32(fl64(approx - w)), fl32(fl64(approx + w))
      certified where  bits(lo32) == bits(hi32)                          (acc = hi32)
    the rest (open): certified where f(lo32) == f(hi32) and pre(lo32), pre(hi32) are
                    nonzero of one sign                                  (acc = hi32)
                    else exact: +-0 where every gathered product is zero, else the split
                    certificate on the gathered products (exact when every low part is
                    zero), else round to odd (integer limbs, ``round_to_odd_sum``)
    out = rnd_out(pre(acc))

Proof. (1) Enclosure: ``certificate`` (the interval certificate, N = ||a_i|| ||b_j||, as on the
general path): fl64(approx - w) <= s <= fl64(approx + w). The norms' sums may run in any
order (they are taken chunk by chunk as a and b are widened): their error bound holds for
every order. (2) Monotonicity. rnd32, x -> fl32(x + b) and rnd_out are monotonic
(non-decreasing), so f(rnd32(low end)) <= f(rnd32(s)) <= f(rnd32(high end)): equal bit
patterns at both ends give the bits at s. With equal bits at the fp32 level, rnd32(s) is that
value (as in the general path); at the f level only f(rnd32(s)) is known, so the element keeps
acc = hi32, whose f is the same and which is nonzero exactly when rnd32(s) is (both ends
nonzero of one sign after ``pre``): the underflow counts (``observers.rounded``) see the same
zero / nonzero pattern as on the general path. (3) Signed zeros. An all-zero row of a or
column of b has a BLAS zero of either sign and would have w = 0; the floors (below ||x|| c
and ||x|| for any nonzero float32 line, whose norm is at least 2**-149, so they change no
other w) make w > 0, and the ends are -0 and +0: never certified at the fp32 level; at the f
level pre is then +-0 + bias, nonzero only for a nonzero bias, where the zero's sign does not
matter (+-0 + b = b). Any other exact zero sum has approx = +-0 and w > 0, so lo32 and hi32
differ in sign: not certified at the fp32 level, and at the f level only when a nonzero bias
makes both pre values that same nonzero number. (4) The exact step (``open_elements``), on the
elements left: where every product is zero, s = 0 with the IEEE sign (-0 exactly when every
product is -0, ``sums.zero_sum``; found from the support of a sparse row of a where approx =
+-0, else from the gathered products); else the split certificate
(``certificate.split_certify``: one error-free split makes the float64 sum almost exact, so
it takes all but exact ties and exact sums; where every low part is zero its exact high sum
is s), else the exact sum rounded to odd (``round_to_odd_sum``) and cast once to fp32.
(5) Exact rows (the second certificate, ``certificate.sums_exactly``, a row at a time).
Every a_ik is a multiple of 2**qa_i and every b_kj of 2**qb_j (``certificate.line_quanta``),
so every product, and every partial sum in any order, blocking or FMA, is a multiple of
2**(qa_i + qb_j); with U >= S = sum_k |a_ik b_kj| below 2**(qa_i + qb_j + 53) every partial
sum is a float64 and approx = s. U = cauchy_schwarz_bound(rho_i, max_j sigma_j, g) with
rho_i = ||a_i|| / 2**qa_i, sigma_j = ||b_j|| / 2**qb_j (exact power-of-two scalings, no
over- or underflow for float32 data) bounds S / 2**(qa_i + qb_j) for every j of row i, so
a row with U < 2**53 has approx = s in every column, and rnd32(s) = fl32(approx), the IEEE
cast. Only the sign of an exact zero is not the BLAS's to give: where approx = +-0, s = 0,
and it is -0 exactly when every product is -0, that is (their sum being zero) when
signbit(a_ik) != signbit(b_kj) for every k: every product is then <= 0
(``open_elements.exact_zero_signs``). fp16 and bf16 data (at most 11 significant bits) make
nearly every row exact, and their frequent exact fp32 ties
(which the ends leave open) certified at no cost; fp32 data rarely. Rows are tried where the
output is large against the operands and where a's first row and b's first column are
narrow (at most 16 significant bits); their quanta are then taken while a and b are widened
(in cache), and the rows are used where at least half of them pass.
(6) Batched products (``matmul_batched``: a stack (nb, M, K) @ (nb, K, N), attention's
q @ k^T and weights @ v and their gradients). Fold the stack into a (nb M, K) of rows and
b (K, nb N) of columns (views where the layouts allow, else one float32 copy each); element
(i, j) of block t is row t M + i of a times column t N + j of b: the block diagonal of the
folded product, each element its own dot product. So (1)-(5) hold element by element as
they stand: the norms, quanta and widths are per folded row and column, one batched float64
BLAS product gives approx, the fp32 ends take each row's widths from its own block
(``certify_fp32_open``'s ``row_blocks``; its one width per chunk is the largest over the
chunk's blocks, which encloses s as well), exact rows bound U by the largest sigma of the
row's block, and the exact step gathers from the folded a and b (``open_elements``
unchanged). ``product_count.count_products`` counts the open and exactly summed elements.
(7) The reduction in parts (``product_parts.matmul_in_parts``: a and b arrive as slices of
K, conv2d's dW batch by batch): (1)-(4) read a and b only through approx, the norms and the
open elements' lines, each of which the parts give (that module's docstring).
Non-finite inputs (seen as non-finite norms), K = 0 and empty shapes are left to the general
path (``matmul_2d`` and ``matmul_batched`` return None). The fp32 ends are computed chunk by chunk
(``certificate.certify_fp32_open``; first with the chunk's largest w, which encloses s as
well, then, where those ends differ, with each element's own w: the same open elements and
ends): only the elements left open leave the loop, with their ends; every later step works
on those gathered elements. Work arrays are reused per thread
(``widening.work_array``); results are always fresh arrays.
"""
from __future__ import annotations

from typing import NamedTuple

from ..backend import bitcast, bits, is_contiguous, round_to, size, tuning, xp
from ..formats import FP32
from . import observers
from .certificate import certify_fp32_open, error_factor, width_factor
from .exact_dots import cauchy_schwarz_bound
from .open_elements import exact_elements, exact_zero_signs, gather_source
from .product_count import note_fast
from .widening import widen_with_norms, work_array

__all__ = ["matmul_2d", "matmul_batched", "round_out", "settle_open", "certificate_widths"]

_ROW_FLOOR = 2.0 ** -600  # width floors: w > 0 for all-zero lines, below any nonzero one's
_COL_FLOOR = 2.0 ** -400
_EXACT_BELOW = 2.0 ** 53  # products' sum bound, in units of their common quantum
_WIDE_BITS = 0xFF        # float32 fraction bits below 15: set in nearly every fp32 value


def round_out(x32: xp.ndarray, fmt) -> xp.ndarray:
    """float32 values rounded once to ``fmt`` (nearest even), as ``round_to`` gives them, for
    any input without a signalling NaN (IEEE arithmetic and float64 -> float32 casts only make
    quiet ones; ``round_to`` would quiet a signalling one): FP32 is then the identity (same
    format, subnormals kept, payloads fit)."""
    if fmt == FP32:
        return x32
    return round_to(x32, fmt)


def matmul_2d(a: xp.ndarray, b: xp.ndarray, out_fmt, bias: xp.ndarray | None = None, *,
              note: bool = True) -> xp.ndarray | None:
    """ExactAccumulation(fp32) ``a @ b`` (+ ``bias`` in the fp32 accumulator) rounded to
    ``out_fmt``, as float32; None where the fast path does not apply. ``note``: report
    (accumulator + bias, output) as a rounding (``observers.rounded``), as
    ``accumulation._to_output`` does."""
    a, b = xp.asarray(a), xp.asarray(b)
    bias = None if bias is None else xp.asarray(bias)
    m, k = a.shape
    n = b.shape[1]
    if k == 0 or m == 0 or n == 0:
        return None
    # One error state for the whole product (it only silences warnings, values are IEEE's):
    # overflow to inf and inf - inf are the arithmetic the proof reads.
    with xp.errstate(over="ignore", invalid="ignore"):
        # float32 values cannot overflow a float64 sum: finite exactly when every one is
        if bias is not None and not xp.isfinite(xp.sum(bias, dtype=xp.float64)):
            return None
        return _matmul_2d(a, b, out_fmt, bias, note, k, _Blocks(1, m, n))


def matmul_batched(a: xp.ndarray, b: xp.ndarray, out_fmt, *, note: bool = True
                   ) -> xp.ndarray | None:
    """ExactAccumulation(fp32) ``a @ b`` for stacks of float32 matrices a (nb, M, K) and
    b (nb, K, N) (broadcast views too), rounded to ``out_fmt``, as float32 (nb, M, N); None
    where the fast path does not apply (as ``matmul_2d``). The 2-D path on the product
    folded into two dimensions (module docstring, (6))."""
    a, b = xp.asarray(a), xp.asarray(b)
    count, m, k = a.shape
    n = b.shape[2]
    if k == 0 or not count * m * n:
        return None
    with xp.errstate(over="ignore", invalid="ignore"):
        out = _matmul_2d(_fold_rows(a), _fold_columns(b), out_fmt, None, note, k,
                         _Blocks(count, m, n))
    return None if out is None else xp.reshape(out, (count, m, n))


class _Blocks(NamedTuple):
    """A product folded into 2-D: ``count`` blocks, each ``m`` rows of a (count m, K) by
    ``n`` columns of b (K, count n). Element (i, j) of the (count m, n) result is row i of a
    times column ``column(i, j)`` = (i // m) n + j of b: the block diagonal of the folded
    a @ b (one block: a 2-D product)."""
    count: int
    m: int
    n: int

    def column(self, rows, cols):
        """b's folded column for the elements (rows, cols) of the result."""
        return cols if self.count == 1 else (rows // self.m) * self.n + cols

    def row_blocks(self, rows):
        """The block of each of ``rows`` (None for one block: ``certify_fp32_open``'s
        column widths are then one vector)."""
        return None if self.count == 1 else rows // self.m

    def col_widths(self, col_width):
        """The columns' widths as ``certify_fp32_open`` reads them with ``row_blocks``."""
        return col_width if self.count == 1 else xp.reshape(col_width, (self.count, self.n))


def _fold_rows(a):
    """The rows of a stack a (nb, M, K) as one (nb M, K) matrix: a view where a's rows lie
    one after another, else a C-ordered copy."""
    return xp.reshape(a, (-1, a.shape[2]))


def _fold_columns(b):
    """The columns of a stack b (nb, K, N) as one (K, nb N) matrix: an F-ordered view where
    every matrix of b is F-ordered and they lie one after another (a transposed operand),
    else a C-ordered copy."""
    count, k, n = b.shape
    rows = xp.swapaxes(b, 1, 2)
    if is_contiguous(rows, "C"):
        return xp.reshape(rows, (count * n, k)).T
    return xp.reshape(xp.transpose(b, (1, 0, 2)), (k, count * n))


def _widened(x, name: str, axis: int, try_exact: bool):
    """(float64 values, norms, quanta, the array the exact step gathers from) of an operand,
    widened into the work buffer ``name``."""
    wide, norms, quanta = widen_with_norms(x, name, axis, try_exact)
    return wide, norms, quanta, gather_source(x, wide)


def _matmul_2d(a, b, out_fmt, bias, note, k, blocks: _Blocks):
    try_exact = _exact_rows_worth_trying(a, b, blocks.m, k, blocks.n, blocks.count)
    a64, row_norm, row_quanta, a = _widened(a, "a", 1, try_exact)
    b64, col_norm, col_quanta, b = _widened(b, "b", 0, try_exact)
    # Squares of float32 values cannot overflow a float64 sum (K 2**256 < 2**1024), so the
    # norms (and the sums of their squares, below 2**256 K (M + N)) are finite exactly when
    # a and b are: one check, no extra pass over the operands (dot products: one call each)
    if not xp.isfinite(row_norm @ row_norm + col_norm @ col_norm):
        return None
    approx = _products(a64, b64, blocks)
    shape = approx.shape
    fp32_out = out_fmt == FP32
    # pre is the output itself for fp32; otherwise only a work array (out is rounded from it)
    pre = xp.empty(shape, xp.float32) if fp32_out else work_array("pre", shape, xp.float32)
    row_width, col_width = certificate_widths(row_norm, col_norm, k)
    exact_rows = (_exact_rows(row_norm, col_norm, row_quanta, col_quanta, k, blocks)
                  if try_exact else None)
    if exact_rows is None:
        opened, low32, high32 = certify_fp32_open(
            approx, row_width, blocks.col_widths(col_width), pre,
            blocks.row_blocks(xp.arange(shape[0])))
    else:
        opened, low32, high32 = _certify_exact_rows(approx, exact_rows, row_width,
                                                    col_width, pre, gather_source(a, a64),
                                                    gather_source(b, b64), blocks)
    if bias is not None:
        pre += bias                             # the fp32 epilogue: one float32 addition
    out = pre if fp32_out else round_to(pre, out_fmt)     # acc = hi32 wherever certified
    exact = 0
    if opened.shape[0]:
        def exact_at(rows, cols, where):
            return exact_elements(gather_source(a, a64), gather_source(b, b64), row_norm,
                                  col_norm, rows, blocks.column(rows, cols),
                                  _flat(approx)[where])
        exact = settle_open(opened, low32, pre, out, bias, out_fmt, exact_at)
    if note:
        observers.rounded(pre, out)
    note_fast(blocks.count, size(out), opened.shape[0], exact)
    return out


def certificate_widths(row_norm, col_norm, k: int):
    """(row widths, column widths) whose products are the certificate's w (module docstring,
    (1)). Floors keep w > 0 where a row or column is all zero ((3)); they are below every
    nonzero norm's factor (norms of float32 values are at least 2**-149)."""
    return xp.maximum(row_norm * width_factor(k), _ROW_FLOOR), xp.maximum(col_norm, _COL_FLOOR)


def _products(a64, b64, blocks: _Blocks) -> xp.ndarray:
    """The float64 BLAS product, (count m, n) in a reused buffer: a @ b for one block, else
    one batched product of the blocks (views of the folded operands, in their memory order:
    BLAS reads either)."""
    count, m, n = blocks
    approx = work_array("approx", (count * m, n), xp.float64)
    if count == 1:
        return xp.matmul(a64, b64, out=approx)
    k = a64.shape[1]
    a3 = xp.reshape(a64, (count, m, k))         # C-ordered: ``_fold_rows``
    if is_contiguous(b64, "C"):
        b3 = xp.transpose(xp.reshape(b64, (k, count, n)), (1, 0, 2))
    else:
        b3 = xp.transpose(xp.reshape(b64.T, (count, n, k)), (0, 2, 1))
    xp.matmul(a3, b3, out=xp.reshape(approx, (count, m, n)))
    return approx


def _exact_rows_worth_trying(a, b, m, k, n, blocks: int = 1) -> bool:
    """Whether to look for exact rows (the line quanta then come with the widening): where
    the output outweighs the operands by ``tuning().exact_min_saving`` elements beyond
    K (M + N) (by default always: narrow data leaves many exact fp32 ties open without them,
    and the quanta cost little beside the widening), or the product is batched (``blocks`` >
    1), and a's first row and b's first column hold no value of more than 16 significant
    bits (fp32 data: their rows are almost never exact)."""
    return not ((blocks == 1 and m * n < tuning().exact_min_saving + k * (m + n))
                or xp.count_nonzero(bitcast(a[0], xp.int32) & _WIDE_BITS)
                or xp.count_nonzero(bitcast(b[:, 0], xp.int32) & _WIDE_BITS))


def _exact_rows(row_norm, col_norm, row_quanta, col_quanta, k, blocks: _Blocks | None = None):
    """The rows i whose float64 sums are exact for every column of their block (module
    docstring, (5)): rho_i = ||a_i|| / 2**qa_i, sigma_j = ||b_j|| / 2**qb_j (exact
    scalings), U = cauchy_schwarz_bound(rho_i, max sigma over the block, g) < 2**53; None
    where fewer than half the rows pass (the first certificate alone is then cheaper).
    ``blocks`` None: one block, a 2-D product."""
    count, m, n = blocks or _Blocks(1, row_norm.shape[0], col_norm.shape[0])
    rho = xp.reshape(row_norm / row_quanta, (count, m))
    sigma = xp.max(xp.reshape(col_norm / col_quanta, (count, n)), axis=1)
    exact = xp.reshape(cauchy_schwarz_bound(rho, sigma[:, None], error_factor(k))
                       < _EXACT_BELOW, (-1,))
    return exact if 2 * xp.count_nonzero(exact) >= count * m else None


def _certify_exact_rows(approx, exact_rows, row_width, col_width, pre, a, b, blocks: _Blocks):
    """``certify_fp32_open`` where some rows are exact sums: there pre = fl32(approx) is
    rnd32(s), save the sign of exact zero sums (a BLAS zero's sign is its own, not IEEE's):
    s = 0 there, and ``open_elements.exact_zero_signs`` gives its IEEE sign (a, b: the operands
    to gather from); the other rows take the first certificate."""
    n = approx.shape[1]
    xp.copyto(pre, approx)                  # overflow to inf: the caller's error state
    # flat indices (often thousands of zeros: 1-D gathers are the cheaper ones)
    zeros = xp.flatnonzero(xp.equal(pre, 0, out=work_array("zeros", pre.shape, bool)))
    zeros = zeros[exact_rows[zeros // n] & (_flat(approx)[zeros] == 0)]
    if zeros.shape[0]:
        rows, cols = xp.divmod(zeros, n)
        _flat(pre)[zeros] = exact_zero_signs(a, b, rows, blocks.column(rows, cols))
    rest = xp.flatnonzero(xp.logical_not(exact_rows))
    if not rest.shape[0]:
        return xp.zeros(0, xp.intp), xp.zeros(0, xp.float32), xp.zeros(0, xp.float32)
    high = xp.empty((rest.shape[0], n), xp.float32)
    opened, low32, high32 = certify_fp32_open(approx[rest], row_width[rest],
                                              blocks.col_widths(col_width), high,
                                              blocks.row_blocks(rest))
    pre[rest] = high
    return rest[opened // n] * n + opened % n, low32, high32


def _flat(x) -> xp.ndarray:
    """The C-ordered x as one axis (a view: assigning into it writes x)."""
    return xp.reshape(x, (-1,))


def settle_open(opened, low32, pre, out, bias, out_fmt, exact_at) -> int:
    """pre and out (2-D, C-ordered) at the elements the fp32 certificate left open (flat
    indices ``opened``, their low ends ``low32``; pre and out hold f's values at the high ends
    there). The f-level certificate takes those where f = rnd_out(pre(.)) gives one bit
    pattern at both ends and pre is nonzero of one sign at both (pre(acc) then keeps the
    zero/nonzero pattern of the exact path; pre and out there are already f's values at the
    high end); it only helps when f is coarser than rnd32 (an output format or a bias). The
    rest are summed exactly by ``exact_at(rows, cols, where)`` (their fp32 exact sums; where:
    their flat indices): returns how many."""
    # flat indices into the C-ordered pre and out (thousands of elements may be open: 1-D
    # gathers are the cheap ones)
    n = pre.shape[1]
    fp32_out = out_fmt == FP32
    flat_pre, flat_out = _flat(pre), _flat(out)
    if bias is not None or not fp32_out:
        pre_low = low32 if bias is None else low32 + bias[opened % n]
        ok = _f_agree(pre_low, flat_pre[opened], flat_out[opened], out_fmt, fp32_out)
        opened = opened[xp.logical_not(ok, out=ok)]
        if not opened.shape[0]:
            return 0
    rows, cols = xp.divmod(opened, n)
    acc = exact_at(rows, cols, opened)
    if bias is not None:
        acc += bias[cols]
    flat_pre[opened] = acc
    if not fp32_out:
        flat_out[opened] = round_to(acc, out_fmt)
    return opened.shape[0]


def _f_agree(pre_low, pre_high, out_high, out_fmt, fp32_out) -> xp.ndarray:
    """Where f gives one bit pattern at both ends and pre is nonzero of one sign at both
    (1-D gathered: pre at the low end, pre and f = rnd_out(pre) at the high end). The ends
    are ordered and pre is monotonic, so pre_low <= pre_high: both are nonzero of one sign
    exactly where pre_low > 0 or pre_high < 0."""
    same = xp.greater(pre_low, 0)
    same |= xp.less(pre_high, 0)
    out_low = pre_low if fp32_out else round_to(pre_low, out_fmt)
    same &= bits(out_low) == bits(out_high)
    return same

