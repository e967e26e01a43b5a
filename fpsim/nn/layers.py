"""Layers: ``Linear``, ``Embedding``, ``ModuleList``, ``Sequential``, ``Dropout``,
``Identity``, activations (``ReLU``, ``LeakyReLU``, ``ELU``, ``Tanh``, ``Sigmoid``, ``GELU``,
``SiLU``, ``Softmax``, ``LogSoftmax``) and the ``MLP`` builder.

Parameters are created in the current policy's ``param`` format (build the model inside
``use_policy("16-true")`` for fp16 parameters); forward passes round as the policy in force
when they run says (``fpsim.autograd.policy``).

>>> import numpy as np
>>> from fpsim.autograd import Tensor, use_policy
>>> model = MLP([4, 8, 3], rng=0)
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> with use_policy("16-mixed"):
...     y = model(Tensor(np.ones((2, 4))))
>>> y.fmt.name, y.shape
('fp16', (2, 3))
"""
from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral

from .. import backend
from ..options import (check_choice, check_count, check_instance, check_real,
                       described)
from ..backend import xp

from .. import autograd as ag
from . import init
from .module import Module, parameter
from .gemm import GemmModule

__all__ = ["Linear", "Embedding", "ModuleList", "Sequential", "Dropout", "Identity", "ReLU",
           "LeakyReLU", "ELU", "Tanh", "Sigmoid", "GELU", "SiLU", "Softmax", "LogSoftmax", "MLP",
           "ACTIVATIONS"]


class Linear(GemmModule):
    """y = x @ weight.T + bias, weight (out, in) initialised U(+-1/sqrt(in)) like PyTorch;
    one fused op (``autograd.linear``: bias added in the fp32 accumulator). Under an FP8
    recipe the layer keeps its GEMM's scaling state (``gemm_slots()``, TE's ``fp8_meta``),
    which training checkpoints save as ``extra_state``; ``fp8=False`` keeps it out of the
    recipe (in the policy's matmul format), as a model keeps its head in bf16."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rng=None,
                 accumulation=None, fp8: bool = True):
        super().__init__()
        self.fp8 = bool(fp8)
        check_count("in_features", in_features, 1)
        check_count("out_features", out_features, 1)
        rng = init.as_rng(rng)
        self.in_features, self.out_features = in_features, out_features
        self.accumulation = accumulation
        self.weight = parameter(init.fan_in_uniform(rng, (out_features, in_features),
                                                    in_features))
        self.bias = (parameter(init.fan_in_uniform(rng, (out_features,), in_features))
                     if bias else None)

    def forward(self, x):
        if not self.fp8:
            return ag.linear(x, self.weight, self.bias, accumulation=self.accumulation,
                             fp8=False)
        return ag.linear(x, self.weight, self.bias, accumulation=self.accumulation,
                         scaling_slots=self.gemm_slots())

    def __repr__(self) -> str:
        return (f"Linear({self.in_features}, {self.out_features}, "
                f"bias={self.bias is not None}, fmt={self.weight.fmt})")


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, dim), initialised N(0, 1) like PyTorch. The
    gradient of repeated indices is summed in float64 and rounded once (``getitem``).

    ``padding_idx`` (an index, negative from the end, or None), as ``torch.nn.Embedding``:
    that row is drawn with the others, then zeroed; it is looked up as stored, but its
    gradient is zero (its positions pass no gradient: ``where`` with the detached rows, no
    rounding), so training leaves it as it is."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, *,
                 rng=None):
        super().__init__()
        check_count("num_embeddings", num_embeddings, 1)
        check_count("embedding_dim", embedding_dim, 1)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = _padding_index(padding_idx, num_embeddings)
        rows = init.normal(rng, (num_embeddings, embedding_dim))
        if self.padding_idx is not None:
            rows[self.padding_idx] = 0.0
        self.weight = parameter(rows)

    def forward(self, indices):
        idx = xp.asarray(indices.data if isinstance(indices, ag.Tensor) else indices)
        if not backend.isdtype(idx.dtype, "integral"):
            raise TypeError(f"Embedding takes integer indices, got dtype {idx.dtype}")
        if backend.size(idx):
            low, high = int(xp.min(idx)), int(xp.max(idx))
            if low < 0 or high >= self.num_embeddings:
                raise ValueError(f"Embedding indices must lie in [0, {self.num_embeddings}), "
                                 f"got values from {low} to {high}")
        rows = ag.getitem(self.weight, backend.astype(idx, xp.intp))
        if self.padding_idx is None:
            return rows
        padding = xp.expand_dims(xp.equal(idx, self.padding_idx), -1)
        return ag.where(padding, rows.detach(), rows)


def _padding_index(padding_idx, num_embeddings: int):
    """``padding_idx`` as a row index in [0, num_embeddings) (None stays None)."""
    if padding_idx is None:
        return None
    check_instance("padding_idx", padding_idx, Integral, "an integer row index or None")
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"padding_idx must lie in [-{num_embeddings}, {num_embeddings}) "
                         f"(num_embeddings), got {padding_idx}")
    return int(padding_idx) % num_embeddings


class ModuleList(Module):
    """Modules held in a list, registered as "0", "1", ... like ``torch.nn.ModuleList`` (so
    their parameters are the model's); no ``forward`` of its own."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__} takes Modules, got "
                            f"{type(module).__name__} at {len(self)}")
        setattr(self, str(len(self)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def __iter__(self):
        return iter(self._children.values())

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, i: int) -> Module:
        return list(self._children.values())[i]


class Sequential(ModuleList):
    """Modules applied in order; registered as "0", "1", ... like ``torch.nn.Sequential``."""

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x):
        for module in self._children.values():
            x = module(x)
        return x


class Dropout(Module):
    """Zeroes each element with probability ``p`` and scales the rest by 1/(1-p) in training
    mode (``autograd.dropout``: PyTorch's CPU arithmetic, Philox mask); the identity in eval
    mode (``eval()``), as ``torch.nn.Dropout``.

    The mask of each training call is drawn from Philox counters ``offset ..
    offset + x.size - 1`` under key ``seed``, then ``offset`` advances by ``x.size``: calls
    never reuse a counter, and the same seed, offset and shapes give the same masks on every
    backend and thread count. ``offset`` is not in ``state_dict`` (as PyTorch's generator
    state is not) but in ``extra_state``, which training checkpoints save, so a resumed run
    draws the masks the uninterrupted one drew. Dropouts of one model with the same seed draw
    the same masks for the same offsets: give each its own ``seed``."""

    def __init__(self, p: float = 0.5, *, seed: int = 0):
        super().__init__()
        p = check_real("p", p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p
        self.seed = check_count("seed", seed, 0)
        if self.seed >= 2 ** 64:            # the masks' Philox key is 64 bits
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.offset = 0

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return ag.as_tensor(x)
        x = ag.as_tensor(x)
        out = ag.dropout(x, self.p, seed=self.seed, offset=self.offset)
        self.offset += x.size
        return out

    def extra_state(self) -> dict:
        return {"offset": self.offset}

    def set_extra_state(self, state: dict) -> None:
        offset = state.get("offset") if isinstance(state, dict) else None
        if set(state) != {"offset"} or isinstance(offset, bool) or not isinstance(offset, int) \
                or offset < 0:
            raise ValueError(f"Dropout's extra state is {{'offset': a non-negative integer}}, "
                             f"got {state!r}")
        self.offset = offset

    def __repr__(self) -> str:
        return f"Dropout(p={self.p}, seed={self.seed})"


class Identity(Module):
    """Its input, unchanged (no op, no rounding), as ``torch.nn.Identity``: a placeholder,
    such as a ResNet block's shortcut; extra arguments are ignored, as PyTorch's are."""

    def forward(self, x, *args, **kwargs):
        return x

    def __repr__(self) -> str:
        return "Identity()"


class _Activation(Module):
    fn = None

    def forward(self, x):
        return type(self).fn(x)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReLU(_Activation):
    fn = staticmethod(ag.relu)


class Tanh(_Activation):
    fn = staticmethod(ag.tanh)


class Sigmoid(_Activation):
    fn = staticmethod(ag.sigmoid)


class GELU(Module):
    """GELU, ``approximate="none"`` (x Phi(x)) or ``"tanh"`` (PyTorch's tanh form), each
    correctly rounded (``fpsim.autograd.gelu``)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = check_choice("approximate", approximate, ("none", "tanh"))

    def forward(self, x):
        return ag.gelu(x, self.approximate)

    def __repr__(self) -> str:
        return f"GELU(approximate={self.approximate!r})"


class SiLU(_Activation):
    fn = staticmethod(ag.silu)


class LeakyReLU(Module):
    """x where x > 0, else ``negative_slope`` x (``autograd.leaky_relu``: PyTorch's float32
    product, rounded once)."""

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = check_real("negative_slope", negative_slope)

    def forward(self, x):
        return ag.leaky_relu(x, self.negative_slope)

    def __repr__(self) -> str:
        return f"LeakyReLU(negative_slope={self.negative_slope})"


class ELU(Module):
    """x where x > 0, else ``alpha`` (e**x - 1) (``autograd.elu``: float64, rounded once)."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = check_real("alpha", alpha)

    def forward(self, x):
        return ag.elu(x, self.alpha)

    def __repr__(self) -> str:
        return f"ELU(alpha={self.alpha})"


class Softmax(Module):
    """``autograd.softmax`` along ``dim`` (an int, negative from the end; PyTorch's implicit
    ``dim=None`` is not offered): correctly rounded, autocast's float32 list (``wide``)."""

    fn = staticmethod(ag.softmax)

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(check_instance("dim", dim, Integral, "an integer axis such as -1"))

    def forward(self, x):
        return type(self).fn(x, self.dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"


class LogSoftmax(Softmax):
    """``autograd.log_softmax`` along ``dim`` (an int): correctly rounded, ``wide``."""

    fn = staticmethod(ag.log_softmax)


ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid, "gelu": GELU}


def MLP(sizes, activation: str = "relu", *, rng=None, bias: bool = True,
        accumulation=None) -> Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with ``activation`` between
    them (none after the last). One Generator (``rng``: seed or Generator) draws every layer's
    weights in order, so a seed fixes the whole model."""
    wanted = "a list of positive integers such as [16, 32, 4]"
    check_instance("MLP sizes", sizes, Iterable, wanted)
    if isinstance(sizes, (str, bytes)):        # '16,4' would be the sizes '1', '6', ','...
        raise TypeError(f"MLP sizes must be {wanted}, got {described(sizes)}")
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"MLP needs at least two sizes (inputs, outputs), got {sizes}")
    for i, size in enumerate(sizes):
        check_count(f"MLP sizes[{i}]", size, 1)
    sizes = [int(s) for s in sizes]
    check_choice("activation", activation, tuple(ACTIVATIONS))
    rng = init.as_rng(rng)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Linear(n_in, n_out, bias, rng=rng, accumulation=accumulation))
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
    return Sequential(*layers)
