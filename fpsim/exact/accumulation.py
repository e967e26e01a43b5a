"""How dot products and sums accumulate: the ``exact``, ``sequential`` and ``blocked`` models.

``matmul`` and ``reduce_sum`` take float32 containers holding values of any fpsim format and
return float32 containers holding values of ``out_fmt``. Products of two float32 values are
exact in float64 (24 + 24 significand bits, exponents >= 2**-298), so every model starts from
exact products; the models differ only in where the sum is rounded.

``ExactAccumulation(acc="fp32")`` (the default)
    Each dot product (or sum) is computed exactly, rounded once to ``acc`` (round to nearest,
    ties to even), then once to ``out_fmt``. Fast path (``certified``): a float64 BLAS product
    plus a rigorous error bound that certifies, element by element, that the float64 result
    rounds to the same bits as the exact value; the rare element it cannot certify is summed
    exactly with integer limbs (``sums``). The bits do not depend on the BLAS, its
    order or its threads.
``SequentialAccumulation(fmt="fp32", fused=True)``
    ``acc = +0; for k in 0..K-1: acc = round_fmt(acc + a[k] * b[k])`` in index order, one
    rounding per step (fused multiply-add: the product is exact). ``fused=False`` rounds the
    product to ``fmt`` first (two roundings per step). Slow (a Python loop over K), but it is
    how an fp16 accumulator stalls: summing 4096 ones in fp16 stops at 2048.
``BlockedAccumulation(k, fmt="fp32", alignment_bits=None, rounding="nearest_even")``
    A tensor-core-like multi-term fused add: ``acc = round_fmt(acc + sum of k exact
    products)`` per block of k consecutive products. ``alignment_bits=F`` adds the truncation
    of NVIDIA's adders (see ``block_fma``; presets ``BlockedAccumulation.v100()``, ``a100()``,
    ``h100()`` or ``tensor_core("v100")``, after Fasi, Higham, Mikaitis & Pranesh, PeerJ CS
    7:e330, 2021; one block alone: ``model.block_fma(c, a, b)``).
``PromotedAccumulation(inner, interval)`` (``promoted.py``; ``"h100-fp8:promote=128"``)
    Hopper's FP8 GEMM: the ``inner`` blocked model over chunks of ``interval`` products, each
    chunk's result added into an fp32 accumulator (DeepSeek-V3's promotion); ``"h100-fp8"``
    alone reduces all of K in the tensor core's limited-precision accumulator.

Non-finite inputs follow IEEE arithmetic on the exact products: inf * 0 is NaN, a NaN
product or +inf and -inf together give NaN, otherwise an infinite product gives that infinity.
A finite sum beyond the accumulator's range overflows as ``round_to`` does (to inf).

>>> import numpy as np
>>> a = np.ones((1, 4096), np.float32); b = np.ones((4096, 1), np.float32)
>>> float(matmul(a, b, out_fmt="fp32")[0, 0]), float(matmul(a, b, out_fmt="fp32",
...       model=SequentialAccumulation("fp16"))[0, 0])
(4096.0, 2048.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..backend import astype, round_to, xp
from ..formats import FP16, FP32, Format, get
from ..rounding import MODES
from . import block_fma as blocks, observers
from .exact_dots import exact_matmul, exact_rows_sum
from .fast_matmul import matmul_2d, matmul_batched, round_out
from .product_count import note_general
from .odd_rounding import add_round_to_odd

__all__ = ["Accumulation", "ExactAccumulation", "SequentialAccumulation", "BlockedAccumulation",
           "tensor_core", "get_accumulation", "register_spec",
           "matmul", "reduce_sum"]


class Accumulation:
    """Base class of the accumulation models (frozen dataclasses).

    ``matmul`` and ``reduce_sum`` compute this module's models themselves; a model defined in
    another module (``promoted``) computes its own sums by overriding the two methods below.
    """

    __slots__ = ()

    def accumulate_matmul(self, a64, b64) -> xp.ndarray:
        """(nb, M, K) @ (nb, K, N) float64 arrays (float32 values) -> float64 (nb, M, N)
        holding the accumulator's values."""
        raise TypeError(f"unknown accumulation model {self!r}")

    def accumulate_rows(self, x64) -> xp.ndarray:
        """Row sums of an (n, K) float64 array (float32 values) -> float64 (n,)."""
        raise TypeError(f"unknown accumulation model {self!r}")


def _format_field(obj, name: str) -> None:
    object.__setattr__(obj, name, get(getattr(obj, name)))


@dataclass(frozen=True)
class ExactAccumulation(Accumulation):
    """The exact dot product, rounded once to ``acc`` (nearest even), then to the output.

    How, whatever the BLAS: a float64 product certified element by element
    (``certificate``: an error-bound interval whose ends round to the same bits), the exact
    integer-limb sum rounded to odd (``sums``) where it cannot certify (``certified``).
    """

    acc: Format | str = FP32

    def __post_init__(self) -> None:
        _format_field(self, "acc")

    def __str__(self) -> str:
        return "exact" if self.acc == FP32 else f"exact:{self.acc.name}"


@dataclass(frozen=True)
class SequentialAccumulation(Accumulation):
    """Recursive summation in ``fmt``, k = 0..K-1 in index order, acc starting at +0.

    ``fused=True``: ``acc = round_fmt(acc + a_k*b_k)``, the product exact, ONE rounding per
    step (a fused multiply-add). ``fused=False``: ``acc = round_fmt(acc + round_fmt(a_k*b_k))``.
    In float64 the sum acc + p may itself round, so each step rounds it to odd
    (``odd_rounding.add_round_to_odd``), then to ``fmt``: one correct rounding, no double rounding.
    """

    fmt: Format | str = FP32
    fused: bool = True

    def __post_init__(self) -> None:
        _format_field(self, "fmt")
        if not isinstance(self.fused, bool):
            raise TypeError(f"fused must be a bool, got {self.fused!r}")

    def __str__(self) -> str:
        return f"sequential:{self.fmt.name}" + ("" if self.fused else ":unfused")


@dataclass(frozen=True)
class BlockedAccumulation(Accumulation):
    """Blocks of ``k`` exact products added to the running accumulator, rounded once per block.

    ``alignment_bits=None``: each block sum (acc + k products) is exact, then rounded to
    ``fmt`` with ``rounding``. ``alignment_bits=F``: as in NVIDIA tensor cores, every term is
    first aligned to the block's largest exponent and truncated (toward zero) to F fraction
    bits below it; the sum of the truncated terms is exact and rounded with ``rounding``.
    ``input_format``: the inputs' format, used only to read subnormal inputs with that
    format's minimum exponent, as hardware does (None: float32's). See ``block_fma``.

    Presets (``fmt`` fp32: round toward zero; fp16: nearest even):
    ``BlockedAccumulation.v100()`` k=4, F=23; ``.a100()`` k=8, F=24; ``.h100()`` k=16, F=25
    (tf32 inputs: k=4 on A100, 8 on H100).
    """

    k: int
    fmt: Format | str = FP32
    alignment_bits: int | None = None
    rounding: str = "nearest_even"
    input_format: Format | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, xp.integer)) or self.k < 1:
            raise ValueError(f"blocked: k must be a positive int (products per block), "
                             f"got {self.k!r}")
        object.__setattr__(self, "k", int(self.k))
        _format_field(self, "fmt")
        if self.input_format is not None:
            _format_field(self, "input_format")
        if self.alignment_bits is not None and (
                isinstance(self.alignment_bits, bool)
                or not isinstance(self.alignment_bits, (int, xp.integer))
                or not 0 <= self.alignment_bits <= 40):
            raise ValueError(f"blocked: alignment_bits must be None or an int in 0..40, "
                             f"got {self.alignment_bits!r}")
        if self.rounding not in MODES or self.rounding == "stochastic":
            raise ValueError(f"blocked: rounding must be one of "
                             f"{', '.join(m for m in MODES if m != 'stochastic')}, "
                             f"got {self.rounding!r}")

    def __str__(self) -> str:
        for gpu in ("v100", "a100", "h100"):
            if self == getattr(BlockedAccumulation, gpu)():
                return gpu
        options = [f"align={self.alignment_bits}"] if self.alignment_bits is not None else []
        if self.rounding != "nearest_even":
            options.append(f"round={self.rounding}")
        if self.input_format is not None:
            options.append(f"input={self.input_format.name}")
        return ":".join([f"blocked:{self.k}:{self.fmt.name}"] + options)

    def block_fma(self, c, a, b) -> xp.ndarray:
        """One block: d = c + sum(a * b) over the last axis (length <= k), as this model
        computes it. c: float32 values in ``fmt``; a, b: float32, broadcast together."""
        return blocks.block_fma(xp.asarray(c), xp.asarray(a), xp.asarray(b), self)

    @classmethod
    def v100(cls, fmt="fp32") -> "BlockedAccumulation":
        """NVIDIA V100 (Volta) tensor core, fp16 inputs: 4 products, no extra bits."""
        return cls._preset(4, 23, FP16, fmt)

    @classmethod
    def a100(cls, input_format="fp16", fmt="fp32") -> "BlockedAccumulation":
        """NVIDIA A100 (Ampere): 8 products (4 for tf32 inputs), one extra alignment bit."""
        return cls._preset(4 if get(input_format).name == "tf32" else 8, 24, input_format, fmt)

    @classmethod
    def h100(cls, input_format="fp16", fmt="fp32") -> "BlockedAccumulation":
        """NVIDIA H100 (Hopper): 16 products (8 for tf32 inputs), two extra alignment bits."""
        return cls._preset(8 if get(input_format).name == "tf32" else 16, 25, input_format,
                           fmt)

    @classmethod
    def _preset(cls, k, bits, input_format, fmt) -> "BlockedAccumulation":
        input_format, fmt = get(input_format), get(fmt)
        if input_format.name not in ("fp16", "bf16", "tf32"):
            raise ValueError(f"tensor-core presets model fp16, bf16 and tf32 inputs, "
                             f"not {input_format.name}")
        if fmt not in (FP32, FP16):
            raise ValueError(f"tensor-core presets accumulate in fp32 or fp16, not {fmt.name}")
        rounding = "toward_zero" if fmt == FP32 else "nearest_even"
        return cls(k, fmt, bits, rounding, input_format)


def tensor_core(gpu: str, input_format="fp16", fmt="fp32") -> BlockedAccumulation:
    """The ``blocked`` preset of a GPU: ``"v100"``, ``"a100"`` or ``"h100"``."""
    key = str(gpu).strip().lower()
    if key == "v100":
        return BlockedAccumulation.v100(fmt)
    if key in ("a100", "h100"):
        return getattr(BlockedAccumulation, key)(input_format, fmt)
    raise ValueError(f"unknown tensor-core model {gpu!r}; accepted: v100, a100, h100")


_SPEC_HELP = ("accepted: 'exact', 'exact:FMT', 'sequential', 'sequential:FMT', "
              "'sequential:FMT:unfused', 'blocked:K', 'blocked:K:FMT' (options after it: "
              "':align=F', ':round=MODE', ':input=FMT'), 'v100', 'a100', 'h100', "
              "'h100-fp8' (options ':promote=N', ':input=e5m2'), 'promoted:N:BLOCKED', "
              "or an Accumulation")
_BLOCKED_OPTIONS = {"align": "alignment_bits", "round": "rounding", "input": "input_format"}
_REGISTERED_SPECS = {}      # first field of a spec -> parser, for models of other modules


def register_spec(kind: str, parse) -> None:
    """Let ``get_accumulation`` read specs whose first field is ``kind``:
    ``parse(fields)`` gets the lower-cased fields after it and returns the model (or raises
    ValueError). For models defined in modules that import this one (``promoted``)."""
    _REGISTERED_SPECS[kind] = parse


def get_accumulation(spec) -> Accumulation:
    """An accumulation model from a spec string (or an ``Accumulation``, returned as is).

    >>> str(get_accumulation("sequential:fp16")), get_accumulation("blocked:4:fp32").k
    ('sequential:fp16', 4)
    """
    if isinstance(spec, Accumulation):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"an accumulation model is an Accumulation or a string, "
                        f"got {type(spec).__name__}; {_SPEC_HELP}")
    parts = [p.strip() for p in spec.strip().lower().split(":")]
    try:
        kind, args = parts[0], parts[1:]
        if kind == "exact" and len(args) <= 1:
            return ExactAccumulation(*args)
        if kind == "sequential" and len(args) <= 2:
            if len(args) == 2 and args[1] not in ("fused", "unfused"):
                raise ValueError(f"the third field must be 'fused' or 'unfused', got {args[1]!r}")
            unfused = len(args) == 2 and args[1] == "unfused"
            return SequentialAccumulation(*args[:1], fused=not unfused)
        if kind == "blocked" and args:
            if not args[0].isdigit():
                raise ValueError(f"block size must be a positive integer, got {args[0]!r}")
            positional = [a for a in args[1:2] if "=" not in a]
            options = {}
            for item in args[1 + len(positional):]:
                key, _, value = item.partition("=")
                if key not in _BLOCKED_OPTIONS or not value or _BLOCKED_OPTIONS[key] in options:
                    raise ValueError(f"unknown or repeated blocked option {item!r}")
                options[_BLOCKED_OPTIONS[key]] = int(value) if key == "align" and \
                    value.isdigit() else value
            return BlockedAccumulation(int(args[0]), *positional, **options)
        if kind in ("v100", "a100", "h100") and not args:
            return tensor_core(kind)
        if kind in _REGISTERED_SPECS:
            return _REGISTERED_SPECS[kind](args)
    except (ValueError, TypeError) as err:
        raise ValueError(f"bad accumulation spec {spec!r}: {err}") from None
    raise ValueError(f"unknown accumulation spec {spec!r}; {_SPEC_HELP}")


# --- operand checks ----------------------------------------------------------------------

def _operand(x, name: str) -> xp.ndarray:
    array = xp.asarray(x)
    if array.dtype == xp.float16:
        array = astype(array, xp.float32)
    if array.dtype != xp.float32:
        raise TypeError(f"{name} must be a float32 array holding format values (float16 is "
                        f"widened exactly), got dtype {array.dtype}; round with round_to and "
                        f"convert first")
    return array


# --- matmul ------------------------------------------------------------------------------

def matmul(a, b, *, out_fmt, model: Accumulation | str = ExactAccumulation()) -> xp.ndarray:
    """``a @ b`` under an accumulation model; float32 in, float32 holding ``out_fmt`` values out.

    Shapes follow ``numpy.matmul``: a (..., M, K), b (..., K, N), batch dimensions broadcast;
    a 1-D ``a`` is a row (K,), a 1-D ``b`` a column (K,), and that dimension is dropped from
    the result. Each output element is the model's accumulation of its K exact products,
    then one rounding (nearest even) to ``out_fmt``.
    """
    model = get_accumulation(model)
    out_fmt = get(out_fmt)
    a, b = _operand(a, "matmul: a"), _operand(b, "matmul: b")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs arrays of at least 1 dimension, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: a has shape {tuple(a.shape)} "
                         f"(K={a2.shape[-1]}), b has shape {tuple(b.shape)} (K={b2.shape[-2]})")
    if a2.ndim == 2 and b2.ndim == 2:
        batch = ()                      # no batch dimensions (the common case: no lookup)
    else:
        try:
            batch = xp.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            raise ValueError(f"matmul: batch dimensions of a {tuple(a.shape)} and b "
                             f"{tuple(b.shape)} do not broadcast") from None
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    if (b2.ndim == 2 and math.prod(a2.shape) and math.prod(b2.shape)
            and isinstance(model, ExactAccumulation) and model.acc == FP32):
        # Every element is its own exact dot product: stacking a's batches into rows
        # changes no bit, and the 2-D fast path certifies straight to out_fmt.
        # (2-D a, the common case, needs no reshape: a call each way saved)
        out = matmul_2d(a2 if a2.ndim == 2 else xp.reshape(a2, (-1, k)), b2, out_fmt)
        if out is not None:
            if a2.ndim != 2:
                out = xp.reshape(out, a2.shape[:-1] + (n,))
            return _drop_vector_axes(out, a, b)
    count = math.prod(batch)
    a3 = xp.reshape(xp.broadcast_to(a2, batch + (m, k)), (count, m, k))
    b3 = xp.reshape(xp.broadcast_to(b2, batch + (k, n)), (count, k, n))
    if count * m * k * n and isinstance(model, ExactAccumulation) and model.acc == FP32:
        # Each block's elements are their own exact dot products: the batched fast path
        # certifies the stack (broadcast blocks copied) straight to out_fmt
        out = matmul_batched(a3, b3, out_fmt)
        if out is not None:
            return _drop_vector_axes(xp.reshape(out, batch + (m, n)), a, b)
    acc = _accumulate_matmul(a3, b3, model)
    return _drop_vector_axes(xp.reshape(_to_output(acc, out_fmt), batch + (m, n)), a, b)


def _drop_vector_axes(out, a, b):
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def _accumulate_matmul(a3: xp.ndarray, b3: xp.ndarray, model: Accumulation) -> xp.ndarray:
    """(nb, M, K) @ (nb, K, N) -> float64 (nb, M, N) holding accumulator-format values."""
    if isinstance(model, ExactAccumulation):
        acc, exact = exact_matmul(a3, b3, model.acc)
        note_general(a3.shape[0], math.prod(acc.shape), exact)
        return acc
    a64, b64 = astype(a3, xp.float64), astype(b3, xp.float64)
    shape = (a3.shape[0], a3.shape[1], b3.shape[2])
    if isinstance(model, SequentialAccumulation):
        return _sequential(lambda k: a64[:, :, k, None] * b64[:, None, k, :], a3.shape[2],
                           shape, model)
    if isinstance(model, BlockedAccumulation):
        return blocks.blocked_matmul(a64, b64, model)
    return model.accumulate_matmul(a64, b64)


def _to_output(acc: xp.ndarray, out_fmt: Format) -> xp.ndarray:
    # Accumulator values fit float32 exactly; the second rounding runs round_to's fast kernel.
    with xp.errstate(over="ignore", invalid="ignore"):
        wide = astype(acc, xp.float32)
    out = round_out(wide, out_fmt)      # round_to's bits; the identity for fp32
    observers.rounded(wide, out)  # the underflow counts see gradients lost to the format
    return out


# --- reduce_sum --------------------------------------------------------------------------

def reduce_sum(x, axis=None, keepdims: bool = False, *, out_fmt,
               model: Accumulation | str = ExactAccumulation()) -> xp.ndarray:
    """Sum over ``axis`` (None: all; int or tuple) under an accumulation model.

    The reduced elements of each output are taken in C (index) order of the reduced axes:
    the order ``sequential`` adds them in and ``blocked`` cuts them into blocks of k. Terms
    are the values themselves (exact), so the models read as for ``matmul`` with b = 1.
    """
    model = get_accumulation(model)
    out_fmt = get(out_fmt)
    x = _operand(x, "reduce_sum: x")
    axes = _normalise_axes(axis, x.ndim)
    kept = [d for d in range(x.ndim) if d not in axes]
    moved = xp.transpose(x, kept + sorted(axes))
    kept_shape = tuple(x.shape[d] for d in kept)
    width = math.prod(x.shape[d] for d in axes)
    # A view where the layout allows (a column sum: x.T), so that no transposed copy is made;
    # the models read values, never the layout.
    rows = xp.reshape(moved, (math.prod(kept_shape), width))
    acc = _accumulate_rows(rows, model)
    out = _to_output(acc, out_fmt)
    if out.shape != kept_shape:             # (a 1-D result needs no reshape call)
        out = xp.reshape(out, kept_shape)
    if keepdims:
        out = xp.reshape(out, tuple(1 if d in axes else x.shape[d] for d in range(x.ndim)))
    return out


def _normalise_axes(axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, xp.integer)):
            raise TypeError(f"reduce_sum: axis must be None, an int or a tuple of ints, "
                            f"got {axis!r}")
        if not -ndim <= item < ndim:
            raise ValueError(f"reduce_sum: axis {item} is out of range for an array of "
                             f"{ndim} dimensions")
        out.append(int(item) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"reduce_sum: repeated axis in {axis!r}")
    return tuple(out)


def _accumulate_rows(rows: xp.ndarray, model: Accumulation) -> xp.ndarray:
    if isinstance(model, ExactAccumulation):
        return exact_rows_sum(rows, model.acc)[0]
    x64 = astype(rows, xp.float64)
    if isinstance(model, SequentialAccumulation):
        return _sequential(lambda k: x64[:, k], rows.shape[1], (rows.shape[0],), model)
    if isinstance(model, BlockedAccumulation):
        return blocks.blocked_rows(x64, model)
    return model.accumulate_rows(x64)


# --- the sequential model ----------------------------------------------------------------

def _sequential(term, count: int, shape: tuple, model: SequentialAccumulation) -> xp.ndarray:
    fmt = model.fmt
    acc = xp.zeros(shape, xp.float64)
    with xp.errstate(over="ignore", invalid="ignore"):
        for k in range(count):
            p = term(k)
            if not model.fused:
                p = round_to(p, fmt)
            acc = round_to(add_round_to_odd(acc, p), fmt)
    return acc
