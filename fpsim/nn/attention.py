"""Attention: ``MultiheadAttention``, ``causal_mask``, the pre-LN or post-LN
``TransformerBlock`` and ``TransformerEncoder`` (a stack of blocks, PyTorch's names).

``MultiheadAttention`` follows ``torch.nn.MultiheadAttention``'s computation with
``need_weights=True`` (its default, ``F.multi_head_attention_forward``'s explicit path), each
step an engine op, so each rounds where the policy says (under "16-mixed" as autocast)::

    q, k, v = linear(x, in_proj_weight, in_proj_bias) split in three   # matmul: fp16
    per head (B, H, L, D), D = embed_dim / num_heads:
    q = q * sqrt(1 / D)          # the Python double sqrt(1/D) as float32, one float32
                                 # multiplication rounded to q's format (torch: q * scalar)
    s = q @ k^T                  # matmul: fp16 (exact dot products rounded once)
    s = masked_fill(s, masked, -inf)   # boolean masks: exact;
    s = s + mask                 # an additive float mask, cast to s's format: one rounding
    p = softmax(s, -1)           # wide: fp32 (autocast's float32 list), correctly rounded
    o = p @ v                    # matmul: both cast to fp16
    out = linear(concat heads(o), out_proj)                            # matmul: fp16

``torch.nn.MultiheadAttention(need_weights=False)`` and ``TransformerEncoderLayer`` go through
``scaled_dot_product_attention`` instead, whose math path scales q and k by D**-1/4 each:
for D a power of 4 (4, 16, 64, 256) both scalings are exact powers of two and every value is
the same; otherwise the two differ in the last bits of the scaled operands. A fully masked
row gives NaN (softmax of all -inf), as in PyTorch.

Masks, as PyTorch: ``attn_mask`` (L, S) or (B * num_heads, L, S), boolean (True: not
allowed) or float (added); ``key_padding_mask`` (B, S), boolean (True: padding) or float;
``causal_mask(L)`` is the boolean (L, L) mask above the diagonal.

``batch_first=False`` (PyTorch's default) takes and gives (L, B, E): the same computation
between two transposes, which move values and never round.

``TransformerBlock`` is ``torch.nn.TransformerEncoderLayer`` with the same sub-module names
(``norm1``, ``self_attn``, ``norm2``, ``linear1``, ``linear2``, ``dropout``, ``dropout1``,
``dropout2``); ``norm_first=True`` (pre-LN, fpsim's default)::

    x = x + dropout1(self_attn(norm1(x)))
    x = x + dropout2(linear2(dropout(activation(linear1(norm2(x))))))

and ``norm_first=False`` (post-LN, PyTorch's default)::

    x = norm1(x + dropout1(self_attn(x)))
    x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

``TransformerEncoder(layers, norm=None)`` is ``torch.nn.TransformerEncoder``: the blocks in
turn (``layers.0``, ``layers.1``, ...), then ``norm`` when given; ``forward(src, mask=None,
src_key_padding_mask=None, is_causal=None)`` with PyTorch's argument names (``is_causal`` is
PyTorch's hint that ``mask`` is causal: the mask alone decides, here as there).

>>> import numpy as np
>>> from fpsim.autograd import Tensor, use_policy
>>> attn = MultiheadAttention(8, 2, rng=0)
>>> with use_policy("16-mixed"):
...     out, weights = attn(Tensor(np.ones((2, 5, 8))), attn_mask=causal_mask(5))
>>> out.shape, out.fmt.name, weights.shape, weights.fmt.name
((2, 5, 8), 'fp16', (2, 5, 5), 'fp32')
"""
from __future__ import annotations

import math

from .. import autograd as ag
from .. import backend
from ..backend import xp
from ..options import check_choice, check_count, check_flag, check_instance, check_real
from . import init
from .layers import GELU, Dropout, Linear, ModuleList, ReLU
from .module import Module, parameter
from .gemm import GemmModule
from .norm import LayerNorm

__all__ = ["MultiheadAttention", "TransformerBlock", "TransformerEncoder", "causal_mask"]


def causal_mask(length: int):
    """The boolean (L, L) causal mask: True above the diagonal (position j > i not allowed),
    PyTorch's ``nn.Transformer.generate_square_subsequent_mask`` as a boolean mask."""
    check_count("length", length, 1)
    pos = xp.arange(length)
    return xp.greater(xp.expand_dims(pos, 0), xp.expand_dims(pos, 1))


def _mask_array(mask):
    """A mask's values as a backend array (a Tensor's data, or an array or nested lists)."""
    return mask.data if isinstance(mask, ag.Tensor) else xp.asarray(mask)


class MultiheadAttention(GemmModule):
    """Multi-head attention: ``forward(query, key=None, value=None, key_padding_mask=None,
    need_weights=True, attn_mask=None, average_attn_weights=True)`` returns ``(output (B, L,
    E), weights)`` (output (L, B, E) with ``batch_first=False``), weights (B, L, S) averaged
    over heads, (B, H, L, S) with ``average_attn_weights=False``, None with
    ``need_weights=False``. key and value default to query (self-attention).

    Parameters as PyTorch's (same names, same initialisation): ``in_proj_weight`` (3E, E)
    Xavier-uniform, ``in_proj_bias`` (3E) zeros, ``out_proj`` a ``Linear(E, E)`` whose bias
    is zeroed. ``dropout`` drops attention weights in training mode (``Dropout``, key
    ``seed``)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, batch_first: bool = True, *, rng=None, seed: int = 0,
                 accumulation=None):
        super().__init__()
        check_count("embed_dim", embed_dim, 1)
        check_count("num_heads", num_heads, 1)
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} is not divisible by "
                             f"num_heads {num_heads}")
        rng = init.as_rng(rng)
        self.batch_first = check_flag("batch_first", batch_first)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.accumulation = accumulation
        self.in_proj_weight = parameter(init.xavier_uniform(rng, (3 * embed_dim, embed_dim)))
        self.in_proj_bias = parameter(init.zeros((3 * embed_dim,))) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias, rng=rng, accumulation=accumulation)
        if bias:
            self.out_proj.bias = parameter(init.zeros((embed_dim,)))
        self.attn_dropout = Dropout(check_real("dropout", dropout), seed=seed)

    def _heads(self, t, length):
        """(B, T, E) -> (B, H, T, D)."""
        return t.reshape(t.shape[0], length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    def _project(self, query, key, value):
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        acc = self.accumulation
        if key is query and value is query:      # one product, then split (as PyTorch)
            proj = ag.linear(query, w, b, accumulation=acc,
                             scaling_slots=self.gemm_slots("in_proj"))
            return proj[..., :e], proj[..., e:2 * e], proj[..., 2 * e:]
        parts = []
        for i, x in enumerate((query, key, value)):
            rows = slice(i * e, (i + 1) * e)
            parts.append(ag.linear(x, w[rows], None if b is None else b[rows],
                                   accumulation=acc, scaling_slots=self.gemm_slots("qkv"[i])))
        return tuple(parts)

    def forward(self, query, key=None, value=None, key_padding_mask=None,
                need_weights: bool = True, attn_mask=None, average_attn_weights: bool = True):
        query = ag.as_tensor(query)
        key = query if key is None else ag.as_tensor(key)
        value = key if value is None else ag.as_tensor(value)
        if not self.batch_first:        # (L, B, E): the same computation between transposes
            query, key, value = _batch_first(query, key, value)
            out, weights = self._attend(query, key, value, key_padding_mask, need_weights,
                                        attn_mask, average_attn_weights)
            return out.transpose(1, 0, 2), weights
        return self._attend(query, key, value, key_padding_mask, need_weights, attn_mask,
                            average_attn_weights)

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights):
        if query.ndim != 3 or query.shape[2] != self.embed_dim:
            raise ValueError(f"MultiheadAttention expects query {self._layout()}, got "
                             f"shape {query.shape}")
        if key.shape != value.shape or key.ndim != 3 or key.shape[0] != query.shape[0]:
            raise ValueError(f"MultiheadAttention: key and value must both be "
                             f"{self._layout('source length')} with the query's batch")
        batch, length, source = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = self._project(query, key, value)
        q = self._heads(q, length) * math.sqrt(1.0 / self.head_dim)
        scores = ag.matmul(q, self._heads(k, source).transpose(0, 1, 3, 2),
                           accumulation=self.accumulation)
        scores = self._masked(scores, attn_mask, key_padding_mask, batch, length, source)
        weights = self.attn_dropout(ag.softmax(scores, axis=-1))
        out = ag.matmul(weights, self._heads(v, source), accumulation=self.accumulation)
        out = self.out_proj(out.transpose(0, 2, 1, 3).reshape(batch, length, self.embed_dim))
        if not need_weights:
            return out, None
        return out, (weights.mean(axis=1) if average_attn_weights else weights)

    def _layout(self, length="length"):
        axes = ["batch", length, str(self.embed_dim)]
        return "(" + ", ".join(axes if self.batch_first else [length] + axes[::2]) + ")"

    def _masked(self, scores, attn_mask, key_padding_mask, batch, length, source):
        heads = self.num_heads
        shapes = {"attn_mask": ((length, source), (batch * heads, length, source)),
                  "key_padding_mask": ((batch, source),)}
        for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
            if mask is None:
                continue
            m = _mask_array(mask)
            if tuple(m.shape) not in shapes[name]:
                raise ValueError(f"MultiheadAttention: {name} has shape {tuple(m.shape)}; "
                                 f"expected one of {list(shapes[name])}")
            if name == "key_padding_mask":
                m = xp.reshape(m, (batch, 1, 1, source))
            elif m.ndim == 3:
                m = xp.reshape(m, (batch, heads, length, source))
            if backend.isdtype(m.dtype, "bool"):
                scores = ag.masked_fill(scores, m, -math.inf)
            else:       # additive: cast into the scores' format, then one addition
                scores = scores + ag.cast(ag.Tensor(m), scores.fmt)
        return scores

    def __repr__(self) -> str:
        return (f"MultiheadAttention({self.embed_dim}, num_heads={self.num_heads}, "
                f"fmt={self.in_proj_weight.fmt})")


def _batch_first(*tensors):
    """(L, B, E) -> (B, L, E) for each, a tensor used twice transposed once (self-attention
    stays recognisable: one projection, then split)."""
    done = {}
    for t in tensors:
        if id(t) not in done:
            if t.ndim != 3:
                raise ValueError(f"MultiheadAttention (batch_first=False) expects (length, "
                                 f"batch, embed_dim) inputs, got shape {t.shape}")
            done[id(t)] = t.transpose(1, 0, 2)
    return tuple(done[id(t)] for t in tensors)


class TransformerBlock(Module):
    """Transformer block (module doc), pre-LN or with ``norm_first=False`` post-LN:
    ``forward(x, attn_mask=None, key_padding_mask=None)`` on (B, L, d_model), (L, B, d_model)
    with ``batch_first=False``. The feed-forward width is
    ``dim_feedforward`` (default ``mlp_ratio * d_model``); ``activation`` "gelu" (exact,
    PyTorch's ``F.gelu``) or "relu"; ``dropout`` on the attention weights, after the
    activation and on both residual branches, as PyTorch (seeds ``seed`` .. ``seed + 3``)."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 *, dim_feedforward: int | None = None, activation: str = "gelu",
                 layer_norm_eps: float = 1e-5, bias: bool = True, rng=None, seed: int = 0,
                 accumulation=None, norm_first: bool = True, batch_first: bool = True):
        super().__init__()
        check_count("d_model", d_model, 1)
        self.norm_first = check_flag("norm_first", norm_first)
        width = (check_count("mlp_ratio", mlp_ratio, 1) * d_model if dim_feedforward is None
                 else check_count("dim_feedforward", dim_feedforward, 1))
        check_choice("activation", activation, ("gelu", "relu"))
        rng = init.as_rng(rng)
        self.d_model, self.dim_feedforward = d_model, width
        self.self_attn = MultiheadAttention(d_model, num_heads, dropout, bias, batch_first,
                                            rng=rng, seed=seed, accumulation=accumulation)
        self.linear1 = Linear(d_model, width, bias, rng=rng, accumulation=accumulation)
        self.dropout = Dropout(dropout, seed=seed + 1)
        self.linear2 = Linear(width, d_model, bias, rng=rng, accumulation=accumulation)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout, seed=seed + 2)
        self.dropout2 = Dropout(dropout, seed=seed + 3)
        self.activation = GELU() if activation == "gelu" else ReLU()

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        x = ag.as_tensor(x)
        if not self.norm_first:
            x = self.norm1(x + self._attended(x, attn_mask, key_padding_mask))
            return self.norm2(x + self._feed_forward(x))
        x = x + self._attended(self.norm1(x), attn_mask, key_padding_mask)
        return x + self._feed_forward(self.norm2(x))

    def _attended(self, h, attn_mask, key_padding_mask):
        attended, _ = self.self_attn(h, h, h, key_padding_mask=key_padding_mask,
                                     need_weights=False, attn_mask=attn_mask)
        return self.dropout1(attended)

    def _feed_forward(self, h):
        hidden = self.dropout(self.activation(self.linear1(h)))
        return self.dropout2(self.linear2(hidden))

    def __repr__(self) -> str:
        return (f"TransformerBlock({self.d_model}, heads={self.self_attn.num_heads}, "
                f"dim_feedforward={self.dim_feedforward})")


class TransformerEncoder(Module):
    """``torch.nn.TransformerEncoder`` (module doc): ``layers`` (blocks, kept as the
    ``ModuleList`` ``layers``) in turn, then ``norm`` (a ``LayerNorm``, or None)."""

    def __init__(self, layers, norm=None):
        super().__init__()
        layers = list(layers)
        if not layers or not all(isinstance(layer, TransformerBlock) for layer in layers):
            raise TypeError(f"TransformerEncoder: layers must be one or more "
                            f"TransformerBlock, got {[type(x).__name__ for x in layers]}")
        check_instance("norm", norm, (LayerNorm, type(None)), "a LayerNorm or None")
        self.layers = ModuleList(layers)
        self.num_layers = len(layers)
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = ag.as_tensor(src)
        for layer in self.layers:
            x = layer(x, attn_mask=mask, key_padding_mask=src_key_padding_mask)
        return x if self.norm is None else self.norm(x)

    def __repr__(self) -> str:
        return f"TransformerEncoder({self.num_layers} x {self.layers[0]!r})"
