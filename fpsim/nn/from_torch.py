"""``from_torch(module)``: the fpsim model with the same weights as a ``torch.nn.Module`` made
of supported layers, a correctness oracle the project did not write (run both, compare).

Nothing here imports torch: the layers are recognised by their class (``torch.nn``'s own
classes, by module path and name) and read through their attributes, weights through
``.detach().cpu().numpy()``. Each fpsim layer is built with the torch layer's configuration
in the current policy (parameters in its ``param`` format: under "32-true" an fp32 torch
model's values are copied exactly) and loaded with ``load_state_dict``, so parameters and
buffers (BatchNorm's running statistics) carry over with their names; ``training`` is copied.

Supported (``SUPPORTED``): Linear, Conv1d and Conv2d (zero padding), MaxPool2d and
AvgPool2d (no ceil_mode, dilation, divisor_override; AvgPool2d counting padding, PyTorch's
default), AdaptiveAvgPool2d (sizes given, no None), Flatten (to the last axis), Unflatten (a
tuple of sizes), Identity, LayerNorm, GroupNorm, BatchNorm2d (a numeric momentum;
``num_batches_tracked`` copied), Embedding (padding_idx; no max_norm, sparse), ReLU,
LeakyReLU, ELU (not inplace), Tanh, Sigmoid, GELU, SiLU, Softmax and LogSoftmax (dim given),
Dropout, Sequential, ModuleList, MultiheadAttention (one embedding size, no bias_k /
add_zero_attn), LSTM (batch_first=True, unidirectional, no projection; several layers with
dropout between them; a one-layer fpsim ``LSTM`` returns h and c as (B, H), PyTorch as
(1, B, H)), TransformerEncoderLayer (pre-LN or post-LN, relu or gelu:
``TransformerBlock``), TransformerEncoder (its layers, then a LayerNorm or none). Any other
torch.nn layer, or a supported layer with an option fpsim lacks, is a ``ValueError`` naming
it (and its path in the model). Any other module (a subclass of ``torch.nn.Module`` with its
own ``forward``) is traced (``fpsim.nn.traced``).

Dropout layers (and an LSTM's dropout between layers) get seeds 0, 1, 2, ... in model order
(PyTorch's masks come from its own generator; fpsim's from Philox, so only their
distribution is shared).

Sharing carries over: a module used twice (``Sequential(lin, ReLU(), lin)``) becomes one fpsim
module used twice, and a Parameter shared by two modules (tied weights) one fpsim parameter,
so gradients of both uses add up and the optimizer steps it once. A container's own
parameters and buffers are copied too, and each module keeps its training mode. What fpsim
cannot do is refused by name: a frozen parameter (``requires_grad=False``: fpsim's optimizers
update every parameter), a shared buffer, two Parameters on one memory, and hooks (forward,
forward-pre, backward, on a module, a parameter or global), which would change what the model
computes.
"""
from __future__ import annotations

import sys

from ..backend import xp
from ..options import check_instance, described

from ..autograd import Tensor, current_policy
from .attention import MultiheadAttention, TransformerBlock, TransformerEncoder
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .conv import AdaptiveAvgPool2d, Conv1d, Unflatten
from .layers import (ELU, GELU, Dropout, Embedding, Identity, LeakyReLU, Linear, LogSoftmax,
                     ModuleList, ReLU, Sequential, Sigmoid, SiLU, Softmax, Tanh)
from .lstm import LSTM
from . import exported, traced
from .module import parameter
from .norm import BatchNorm2d, GroupNorm, LayerNorm

__all__ = ["from_torch", "SUPPORTED"]

SUPPORTED = ("Linear", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
             "Identity", "Flatten", "Unflatten", "LeakyReLU", "ELU", "Softmax", "LogSoftmax",
             "LayerNorm", "GroupNorm",
             "BatchNorm2d", "Embedding", "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "Dropout",
             "Sequential", "ModuleList", "MultiheadAttention", "LSTM",
             "TransformerEncoderLayer", "TransformerEncoder")


class _Context:
    """The conversion's running state: the next Dropout seed, the modules converted so far
    (a module used twice is converted once) and the tensors met so far (tied weights)."""

    def __init__(self):
        self.seeds = 0
        self.modules = {}       # id(torch module) -> its fpsim module
        self.tensors = {}       # id(torch tensor) -> (torch tensor, path, fpsim tensor)
        self.memory = {}        # (start, end) of a parameter's bytes -> its path

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
    """The torch layer's own state (parameters and buffers, BatchNorm's int64
    ``num_batches_tracked`` included) as host arrays, keyed by name."""
    rename = rename or {}
    return {rename.get(k, k): v.detach().cpu().numpy() for k, v in layer.state_dict().items()}


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
    conv = Conv1d if _name(layer) == "Conv1d" else Conv2d
    return _loaded(conv(layer.in_channels, layer.out_channels, layer.kernel_size,
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
    if layer.max_norm is not None or layer.sparse:
        _refuse(layer, path, "max_norm and sparse are not supported")
    return _loaded(Embedding(layer.num_embeddings, layer.embedding_dim, layer.padding_idx),
                   layer)


def _adaptive_avg_pool(layer, path, ctx):
    size = layer.output_size
    sizes = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    if any(n is None for n in sizes):
        _refuse(layer, path, f"output_size {size!r}: None (keep the input's size) is not "
                             f"supported; give each size")
    return AdaptiveAvgPool2d(sizes)


def _softmax(layer, path, ctx):
    if layer.dim is None:
        _refuse(layer, path, "dim=None (PyTorch's implicit, deprecated choice) is not "
                             "supported; give dim")
    return (Softmax if _name(layer) == "Softmax" else LogSoftmax)(layer.dim)


def _elu(layer, path, ctx):
    if layer.inplace:
        _refuse(layer, path, "inplace=True (PyTorch then takes the gradient from the output, "
                             "g (y + alpha)) is not supported")
    return ELU(layer.alpha)


def _group_norm(layer, path, ctx):
    return _loaded(GroupNorm(layer.num_groups, layer.num_channels, layer.eps, layer.affine),
                   layer)


def _unflatten(layer, path, ctx):
    if not isinstance(layer.unflattened_size, (tuple, list)):
        _refuse(layer, path, "only a tuple unflattened_size (no named dims) is supported")
    return Unflatten(layer.dim, tuple(layer.unflattened_size))


def _gelu(layer, path, ctx):
    return GELU(layer.approximate)


def _dropout(layer, path, ctx):
    return Dropout(layer.p, seed=ctx.seed())


def _attention(layer, path, ctx):
    if layer.in_proj_weight is None or layer.bias_k is not None or layer.add_zero_attn:
        _refuse(layer, path, "kdim/vdim, add_bias_kv and add_zero_attn are not supported")
    ours = MultiheadAttention(layer.embed_dim, layer.num_heads, layer.dropout,
                              layer.in_proj_bias is not None, bool(layer.batch_first),
                              seed=ctx.seed())
    return _loaded(ours, layer)


_RENAMES = {"LSTM": {f"{k}_l0": k for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}}


def _renames(layer):
    """torch's state names -> fpsim's where they differ: a one-layer LSTM's drop ``_l0``."""
    if _name(layer) == "LSTM" and layer.num_layers > 1:
        return {}
    return _RENAMES.get(_name(layer), {})


def _lstm(layer, path, ctx):
    if not layer.batch_first or layer.bidirectional or layer.proj_size or not layer.bias:
        _refuse(layer, path, "only batch_first=True, unidirectional, with bias and no "
                             "projection is supported")
    between = layer.num_layers > 1 and layer.dropout > 0     # a Dropout between layers
    ours = LSTM(layer.input_size, layer.hidden_size, layer.num_layers, layer.dropout,
                seed=ctx.seed() if between else 0)
    return _loaded(ours, layer, _renames(layer))


def _encoder_layer(layer, path, ctx):
    act = layer.activation
    act_name = getattr(act, "__name__", _name(act)).lower()
    if act_name not in ("gelu", "relu") or getattr(act, "approximate", "none") != "none":
        _refuse(layer, path, f"activation {act!r}: only relu and exact gelu are supported")
    linear1 = layer.linear1
    ours = TransformerBlock(layer.self_attn.embed_dim, layer.self_attn.num_heads,
                            dropout=layer.dropout.p, dim_feedforward=linear1.out_features,
                            activation=act_name, layer_norm_eps=layer.norm1.eps,
                            bias=linear1.bias is not None, seed=ctx.seed(),
                            norm_first=bool(layer.norm_first),
                            batch_first=bool(layer.self_attn.batch_first))
    ctx.seeds += 3          # the block's four dropouts take seed .. seed + 3
    return _loaded(ours, layer)


def _encoder(layer, path, ctx):
    """TransformerEncoder: its (deep-copied) layers one by one, then its norm."""
    blocks = [_convert(block, _join(path, f"layers.{i}"), ctx)
              for i, block in enumerate(layer.layers)]
    norm = None if layer.norm is None else _convert(layer.norm, _join(path, "norm"), ctx)
    if norm is not None and not isinstance(norm, LayerNorm):
        _refuse(layer, path, f"its norm is {type(layer.norm).__name__}; only LayerNorm is "
                             f"supported")
    return TransformerEncoder(blocks, norm)


def _container(layer, path, ctx):
    ours = Sequential() if _name(layer) == "Sequential" else ModuleList()
    _copy_own_state(ours, layer, path)
    for name, child in layer._modules.items():      # named_children() skips a second use
        if child is None:
            continue
        if hasattr(ours, name):
            _refuse(layer, path, f"its child name {name!r} is taken by fpsim's "
                                 f"{type(ours).__name__}")
        setattr(ours, name, _convert(child, _join(path, name), ctx))
    return ours


def _copy_own_state(ours, layer, path):
    """A container's own parameters and buffers (its forward never reads them, but they are
    state: trained, saved), in the policy's ``param`` format as a leaf layer's."""
    params = {id(p) for p in layer.parameters(recurse=False)}
    own = _state(layer, own_only=True)
    for name, tensor in own.items():
        if not tensor.is_floating_point():
            _refuse(layer, path, f"its own buffer {name!r} is {tensor.dtype}; fpsim holds "
                                 f"floating-point state only")
        zeros = xp.zeros(tuple(tensor.shape), xp.float64)
        if id(tensor) in params:
            setattr(ours, name, parameter(zeros))
        else:
            ours.register_buffer(name, Tensor(zeros, current_policy().param))
    ours.load_state_dict({name: t.detach().cpu().numpy() for name, t in own.items()})


def _join(path, name):
    return ".".join(part for part in (path, name) if part)


def _state(layer, own_only=False):
    """The layer's persistent parameters and buffers as torch tensors, by state-dict name, a
    shared one under each of its names."""
    return {name: t for name, t in layer.state_dict(keep_vars=True).items()
            if not name.endswith("num_batches_tracked") and not (own_only and "." in name)}


_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                 "_backward_hooks")
_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def _hooks(holder, kinds):
    return [kind.strip("_").replace("_", " ") for kind in kinds if getattr(holder, kind, None)]


def _check_module_hooks(layer, path, deep):
    """Hooks run code fpsim's model would not: refuse them (on the layer, and with ``deep``
    on the sub-modules converted with it)."""
    for name, module in (layer.named_modules() if deep else [("", layer)]):
        held = _hooks(module, _MODULE_HOOKS)
        if held:
            _refuse(module, _join(path, name), f"has {' and '.join(held)}, which fpsim "
                                               f"cannot run; remove them to convert")


def _check_global_hooks():
    registry = sys.modules.get("torch.nn.modules.module")
    held = _hooks(registry, tuple(f"_global{kind}" for kind in _MODULE_HOOKS))
    if held:
        raise ValueError(f"from_torch: torch has {' and '.join(held)} registered for every "
                         f"module, which fpsim cannot run; remove them to convert")


def _check_one_mode(layer, path):
    for name, module in layer.named_modules():
        if module.training != layer.training:
            _refuse(module, _join(path, name), f"training={module.training} inside a "
                                               f"layer with training={layer.training}; "
                                               f"fpsim's layer has one mode")


def _owner(ours, name):
    *modules, attr = name.split(".")
    for part in modules:
        ours = getattr(ours, part)
    return ours, attr


def _span(tensor):
    """The bytes [start, end) the tensor's elements occupy."""
    start = tensor.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return start, start + (last + 1) * tensor.element_size()


def _check_memory(tensor, where, ctx):
    """Two Parameters on one memory change together in PyTorch, never as fpsim's copies."""
    if tensor.numel() == 0 or tensor.data_ptr() == 0:
        return
    start, end = _span(tensor)
    for (other_start, other_end), other in ctx.memory.items():
        if start < other_end and other_start < end:
            raise ValueError(f"from_torch: {where!r} shares memory with {other!r} but is "
                             f"another tensor; fpsim cannot alias two tensors (share the "
                             f"Parameter itself to tie them)")
    ctx.memory[(start, end)] = where


def _adopt_tensors(ours, layer, path, ctx, own_only=False):
    """Check the layer's parameters and buffers against what fpsim can hold (refusing frozen
    parameters, hooks and shared buffers by name) and give a Parameter met before (tied
    weights) the fpsim parameter made for it then."""
    params = {id(p) for p in layer.parameters(recurse=not own_only)}
    rename = _renames(layer)
    for name, tensor in _state(layer, own_only).items():
        where, name = _join(path, name), rename.get(name, name)
        is_param = id(tensor) in params
        if is_param and not tensor.requires_grad:
            _refuse(layer, path, f"parameter {where!r} is frozen (requires_grad=False); "
                                 f"fpsim's optimizers update every parameter")
        held = _hooks(tensor, _TENSOR_HOOKS)
        if held:
            _refuse(layer, path, f"{where!r} has {' and '.join(held)}, which fpsim cannot "
                                 f"run; remove them to convert")
        seen = ctx.tensors.get(id(tensor))
        if seen is None:
            _check_memory(tensor, where, ctx)
            owner, attr = _owner(ours, name)
            ctx.tensors[id(tensor)] = (tensor, where, getattr(owner, attr))
        elif not is_param:
            _refuse(layer, path, f"buffer {where!r} is also {seen[1]!r}; fpsim does not "
                                 f"share buffers")
        else:
            owner, attr = _owner(ours, name)
            setattr(owner, attr, seen[2])       # tied: one parameter, both uses


_CONVERTERS = {
    "Linear": _linear, "Conv2d": _conv, "Flatten": _flatten, "LayerNorm": _layer_norm,
    "BatchNorm2d": _batch_norm, "Embedding": _embedding, "GELU": _gelu, "Dropout": _dropout,
    "MultiheadAttention": _attention, "LSTM": _lstm, "TransformerEncoderLayer": _encoder_layer,
    "TransformerEncoder": _encoder,
    "Sequential": _container, "ModuleList": _container,
    "MaxPool2d": lambda layer, path, ctx: MaxPool2d(*_pool_options(layer, path, False)),
    "AvgPool2d": lambda layer, path, ctx: AvgPool2d(*_pool_options(layer, path, True)),
    "ReLU": lambda layer, path, ctx: ReLU(), "Tanh": lambda layer, path, ctx: Tanh(),
    "Sigmoid": lambda layer, path, ctx: Sigmoid(), "SiLU": lambda layer, path, ctx: SiLU(),
    "AdaptiveAvgPool2d": _adaptive_avg_pool, "Identity": lambda layer, path, ctx: Identity(),
    "LeakyReLU": lambda layer, path, ctx: LeakyReLU(layer.negative_slope), "ELU": _elu,
    "Softmax": _softmax, "LogSoftmax": _softmax, "Unflatten": _unflatten, "Conv1d": _conv,
    "GroupNorm": _group_norm,
}


def _convert(layer, path, ctx):
    done = ctx.modules.get(id(layer))
    if done is not None:
        return done             # a module used twice: one fpsim module, used twice
    converter = _CONVERTERS.get(_name(layer))
    if converter is None:
        _refuse(layer, path)
    container = converter is _container
    _check_module_hooks(layer, path, deep=not container)
    if container:
        ours = converter(layer, path, ctx)
        _adopt_tensors(ours, layer, path, ctx, own_only=True)
        ours.training = bool(layer.training)    # its children keep their own modes
    else:
        _check_one_mode(layer, path)
        try:
            ours = converter(layer, path, ctx)
        except KeyError as err:     # load_state_dict: the layer holds more (or less) state
            _refuse(layer, path, f"its parameters and buffers do not fit fpsim's: {err}")
        _adopt_tensors(ours, layer, path, ctx)
        ours.train(bool(layer.training))
    ctx.modules[id(layer)] = ours
    return ours


_HOLDERS = ("Sequential", "ModuleList", "ModuleDict", "Module")     # hold parts, no forward


def _table_only(layer) -> bool:
    """Whether the layer converts by the table alone (no traced forward needed)."""
    name = _name(layer)
    if name in ("Sequential", "ModuleList"):
        return all(_table_only(child) for child in layer._modules.values()
                   if child is not None)
    return bool(name)


def _kind(layer) -> str:
    """How a traced model's sub-module converts: "layer" (by the table), "Sequential",
    "ModuleList" or "holder" (its parts, under its names), or "refused"."""
    kind = _name(layer)
    if kind in _CONVERTERS and kind not in _HOLDERS:
        return "layer"
    if kind in ("Sequential", "ModuleList"):
        return kind
    return "holder" if not kind or kind in _HOLDERS else "refused"


def _own_state(ours, layer, path, ctx):
    """A holder's own parameters, buffers and mode, checked as a container's are."""
    _check_module_hooks(layer, path, deep=False)
    _copy_own_state(ours, layer, path)
    _adopt_tensors(ours, layer, path, ctx, own_only=True)
    ours.training = bool(layer.training)


def _lent(ctx) -> traced.Lent:
    return traced.Lent(kind=_kind, convert=lambda layer, path: _convert(layer, path, ctx),
                       own_state=lambda ours, layer, path: _own_state(ours, layer, path, ctx),
                       supported=", ".join(k for k in SUPPORTED if k not in _HOLDERS))


def from_torch(module, *, example=None):
    """The fpsim ``Module`` equivalent to the ``torch.nn.Module`` ``module`` (module doc):
    same structure, same parameter and buffer names and values, same training modes, the
    same sharing. Known layers and ``Sequential`` chains of them convert by the table, any
    other module by tracing its forward (``fpsim.nn.traced``); where torch.fx cannot trace
    it, ``example`` (a tuple of the forward's inputs, torch tensors) lets torch.export record
    it at the ATen level instead (``fpsim.nn.exported``)."""
    if not any(f"{c.__module__}.{c.__name__}" == "torch.nn.modules.module.Module"
               for c in type(module).__mro__):
        raise TypeError(f"from_torch: module must be a torch.nn.Module, got "
                        f"{described(module)}")
    check_instance("example", example, (tuple, type(None)),
                   "a tuple of the forward's example inputs (or None)")
    _check_global_hooks()
    ctx = _Context()
    if _table_only(module) or _name(module) not in ("", "Sequential"):
        return _convert(module, "", ctx)
    try:
        return traced.build(module, _lent(ctx))
    except traced.Untraceable:
        if example is None:
            raise
    return exported.build(module, example, _lent(ctx))
