"""``from_torch(module)``: the fpsim model with the same weights as a ``torch.nn.Module`` made
of supported layers, a correctness oracle the project did not write (run both, compare).

Nothing here imports torch: the layers are recognised by their class (``torch.nn``'s own
classes, by module path and name) and read through their attributes, weights through
``.detach().cpu().numpy()``. Each fpsim layer is built with the torch layer's configuration
in the current policy (parameters in its ``param`` format: under "32-true" an fp32 torch
model's values are copied exactly) and loaded with ``load_state_dict``, so parameters and
buffers (BatchNorm's running statistics) carry over with their names; ``training`` is copied.

Supported (``SUPPORTED``): Linear, Conv2d (zero padding), MaxPool2d and AvgPool2d (no
ceil_mode, dilation, divisor_override; AvgPool2d counting padding, PyTorch's default),
Flatten (to the last axis), LayerNorm, BatchNorm2d (a numeric momentum), Embedding (no
padding_idx, max_norm), ReLU, Tanh, Sigmoid, GELU, SiLU, Dropout, Sequential, ModuleList,
MultiheadAttention (batch_first=True, one embedding size, no bias_k / add_zero_attn), LSTM
(one layer, batch_first=True, unidirectional, no projection; fpsim's ``LSTM`` returns h and c
as (B, H), PyTorch as (1, B, H)), TransformerEncoderLayer (norm_first=True,
batch_first=True, relu or gelu: ``TransformerBlock``). Anything else, or a supported layer
with an option fpsim lacks, is a ``ValueError`` naming it (and its path in the model).

Dropout layers get seeds 0, 1, 2, ... in model order (PyTorch's masks come from its own
generator; fpsim's from Philox, so only their distribution is shared).
"""
from __future__ import annotations

from .attention import MultiheadAttention, TransformerBlock
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .layers import (GELU, Dropout, Embedding, Linear, ModuleList, ReLU, Sequential, Sigmoid,
                     SiLU, Tanh)
from .lstm import LSTM
from .norm import BatchNorm2d, LayerNorm

__all__ = ["from_torch", "SUPPORTED"]

SUPPORTED = ("Linear", "Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "LayerNorm",
             "BatchNorm2d", "Embedding", "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "Dropout",
             "Sequential", "ModuleList", "MultiheadAttention", "LSTM",
             "TransformerEncoderLayer")


class _Context:
    """The conversion's running state: the next Dropout seed."""

    def __init__(self):
        self.seeds = 0

    def seed(self) -> int:
        self.seeds += 1
        return self.seeds - 1


def _name(layer) -> str:
    cls = type(layer)
    return cls.__name__ if cls.__module__.startswith("torch.nn") else ""


def _refuse(layer, path, why=None):
    where = f" at {path!r}" if path else ""
    if why:
        raise ValueError(f"from_torch: {type(layer).__name__}{where}: {why}")
    raise ValueError(f"from_torch: unsupported layer {type(layer).__name__}{where}; "
                     f"supported: {', '.join(SUPPORTED)}")


def _arrays(layer, rename=None):
    """The torch layer's own state (parameters and buffers) as host arrays, keyed by name."""
    rename = rename or {}
    return {rename.get(k, k): v.detach().cpu().numpy() for k, v in layer.state_dict().items()
            if not k.endswith("num_batches_tracked")}


def _loaded(ours, layer, rename=None):
    ours.load_state_dict(_arrays(layer, rename))
    return ours


def _pool_options(layer, path, avg):
    if getattr(layer, "ceil_mode", False):
        _refuse(layer, path, "ceil_mode=True is not supported")
    if not avg and layer.dilation not in (1, (1, 1)):
        _refuse(layer, path, "dilation is not supported")
    if getattr(layer, "return_indices", False):
        _refuse(layer, path, "return_indices=True is not supported")
    if avg and (not layer.count_include_pad or layer.divisor_override is not None):
        _refuse(layer, path, "only count_include_pad=True without divisor_override is "
                             "supported")
    return layer.kernel_size, layer.stride, layer.padding


def _linear(layer, path, ctx):
    return _loaded(Linear(layer.in_features, layer.out_features, layer.bias is not None),
                   layer)


def _conv(layer, path, ctx):
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
        _refuse(layer, path, "only numeric zero padding is supported")
    return _loaded(Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                          layer.stride, layer.padding, layer.dilation, layer.groups,
                          layer.bias is not None), layer)


def _flatten(layer, path, ctx):
    if layer.end_dim != -1:
        _refuse(layer, path, "only end_dim=-1 is supported")
    return Flatten(layer.start_dim)


def _layer_norm(layer, path, ctx):
    affine = layer.elementwise_affine
    return _loaded(LayerNorm(layer.normalized_shape, layer.eps, affine,
                             bias=affine and layer.bias is not None), layer)


def _batch_norm(layer, path, ctx):
    if layer.momentum is None:
        _refuse(layer, path, "momentum=None (a cumulative average) is not supported")
    return _loaded(BatchNorm2d(layer.num_features, layer.eps, layer.momentum, layer.affine,
                               layer.track_running_stats), layer)


def _embedding(layer, path, ctx):
    if layer.padding_idx is not None or layer.max_norm is not None or layer.sparse:
        _refuse(layer, path, "padding_idx, max_norm and sparse are not supported")
    return _loaded(Embedding(layer.num_embeddings, layer.embedding_dim), layer)


def _gelu(layer, path, ctx):
    return GELU(layer.approximate)


def _dropout(layer, path, ctx):
    return Dropout(layer.p, seed=ctx.seed())


def _attention(layer, path, ctx):
    if not layer.batch_first:
        _refuse(layer, path, "only batch_first=True is supported")
    if layer.in_proj_weight is None or layer.bias_k is not None or layer.add_zero_attn:
        _refuse(layer, path, "kdim/vdim, add_bias_kv and add_zero_attn are not supported")
    ours = MultiheadAttention(layer.embed_dim, layer.num_heads, layer.dropout,
                              layer.in_proj_bias is not None, seed=ctx.seed())
    return _loaded(ours, layer)


def _lstm(layer, path, ctx):
    if (layer.num_layers != 1 or not layer.batch_first or layer.bidirectional
            or layer.proj_size or not layer.bias):
        _refuse(layer, path, "only one layer, batch_first=True, unidirectional, with bias "
                             "and no projection is supported")
    rename = {f"{k}_l0": k for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    return _loaded(LSTM(layer.input_size, layer.hidden_size), layer, rename)


def _encoder_layer(layer, path, ctx):
    if not layer.norm_first or not layer.self_attn.batch_first:
        _refuse(layer, path, "only norm_first=True, batch_first=True (pre-LN) is supported")
    act = layer.activation
    act_name = getattr(act, "__name__", _name(act)).lower()
    if act_name not in ("gelu", "relu") or getattr(act, "approximate", "none") != "none":
        _refuse(layer, path, f"activation {act!r}: only relu and exact gelu are supported")
    linear1 = layer.linear1
    ours = TransformerBlock(layer.self_attn.embed_dim, layer.self_attn.num_heads,
                            dropout=layer.dropout.p, dim_feedforward=linear1.out_features,
                            activation=act_name, layer_norm_eps=layer.norm1.eps,
                            bias=linear1.bias is not None, seed=ctx.seed())
    ctx.seeds += 3          # the block's four dropouts take seed .. seed + 3
    return _loaded(ours, layer)


def _container(layer, path, ctx):
    children = [_convert(child, f"{path}.{name}" if path else name, ctx)
                for name, child in layer.named_children()]
    return Sequential(*children) if _name(layer) == "Sequential" else ModuleList(children)


_CONVERTERS = {
    "Linear": _linear, "Conv2d": _conv, "Flatten": _flatten, "LayerNorm": _layer_norm,
    "BatchNorm2d": _batch_norm, "Embedding": _embedding, "GELU": _gelu, "Dropout": _dropout,
    "MultiheadAttention": _attention, "LSTM": _lstm, "TransformerEncoderLayer": _encoder_layer,
    "Sequential": _container, "ModuleList": _container,
    "MaxPool2d": lambda layer, path, ctx: MaxPool2d(*_pool_options(layer, path, False)),
    "AvgPool2d": lambda layer, path, ctx: AvgPool2d(*_pool_options(layer, path, True)),
    "ReLU": lambda layer, path, ctx: ReLU(), "Tanh": lambda layer, path, ctx: Tanh(),
    "Sigmoid": lambda layer, path, ctx: Sigmoid(), "SiLU": lambda layer, path, ctx: SiLU(),
}


def _convert(layer, path, ctx):
    converter = _CONVERTERS.get(_name(layer))
    if converter is None:
        _refuse(layer, path)
    ours = converter(layer, path, ctx)
    return ours.train(bool(layer.training))


def from_torch(module):
    """The fpsim ``Module`` equivalent to the ``torch.nn.Module`` ``module`` (module doc):
    same structure, same parameter and buffer names and values, same training mode."""
    return _convert(module, "", _Context())
