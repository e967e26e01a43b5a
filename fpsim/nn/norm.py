"""Normalisation layers: ``LayerNorm``, ``GroupNorm``, ``BatchNorm2d``.

``LayerNorm`` calls ``fpsim.autograd.layer_norm`` (policy ``wide``: fp32 under "16-mixed", as
autocast runs it; the module doc of ``ops_norm`` says where it rounds).

>>> import numpy as np
>>> from fpsim.autograd import Tensor, use_policy
>>> norm = LayerNorm(4)
>>> [(name, p.shape) for name, p in norm.named_parameters()]
[('weight', (4,)), ('bias', (4,))]
>>> with use_policy("16-mixed"):
...     y = norm(Tensor(np.arange(8.0).reshape(2, 4)).cast("fp16"))
>>> y.fmt.name
'fp32'

``BatchNorm2d`` calls ``fpsim.autograd.batch_norm`` (its doc: batch statistics in training
mode, running statistics in eval mode; output in the input's format, as autocast leaves
batch norm). Its running statistics and batch count are buffers: in ``state_dict``, not
``parameters()``, named and ordered as PyTorch's, so either loads the other's state dict.

>>> bn = BatchNorm2d(3)
>>> list(bn.state_dict())
['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
"""
from __future__ import annotations

from .. import autograd as ag
from ..backend import xp
from ..options import check_between, check_count, check_flag
from . import init
from .module import Module, parameter

__all__ = ["LayerNorm", "GroupNorm", "BatchNorm2d"]


class LayerNorm(Module):
    """Normalises over the trailing ``normalized_shape`` axes; ``weight`` ones and ``bias``
    zeros (PyTorch's init), both omitted with ``elementwise_affine=False``, the bias alone
    with ``bias=False``; ``eps`` is a number > 0 (0 would divide a constant row by 0)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        shape = ((normalized_shape,) if not isinstance(normalized_shape, (tuple, list))
                 else tuple(normalized_shape))
        self.normalized_shape = tuple(check_count("normalized_shape", n, 1) for n in shape)
        self.eps = check_between("eps", eps, 0.0, low_open=True)
        self.weight = parameter(init.ones(shape)) if elementwise_affine else None
        self.bias = parameter(init.zeros(shape)) if elementwise_affine and bias else None

    def forward(self, x):
        return ag.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return (f"LayerNorm({self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.weight is not None})")


class GroupNorm(Module):
    """``torch.nn.GroupNorm``: the ``num_channels`` channels of an (N, C, ...) input in
    ``num_groups`` groups (which must divide C), each sample's group normalised over its
    channels and positions (``autograd.group_norm``: ``layer_norm``'s float64 statistics,
    one rounding; policy ``wide``, fp32 out under "16-mixed" as autocast); per-channel
    ``weight`` ones and ``bias`` zeros, both omitted with ``affine=False``; ``eps`` > 0."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        super().__init__()
        self.num_groups = check_count("num_groups", num_groups, 1)
        self.num_channels = check_count("num_channels", num_channels, 1)
        if self.num_channels % self.num_groups:
            raise ValueError(f"GroupNorm: num_groups={num_groups} must divide num_channels="
                             f"{num_channels}")
        self.eps = check_between("eps", eps, 0.0, low_open=True)
        affine = check_flag("affine", affine)
        shape = (self.num_channels,)
        self.weight = parameter(init.ones(shape)) if affine else None
        self.bias = parameter(init.zeros(shape)) if affine else None

    def forward(self, x):
        x = ag.as_tensor(x)
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm expects input (N, {self.num_channels}, ...), got "
                             f"shape {x.shape}")
        return ag.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return (f"GroupNorm({self.num_groups}, {self.num_channels}, eps={self.eps}, "
                f"affine={self.weight is not None})")


class BatchNorm2d(Module):
    """Batch normalisation of (N, C, H, W) inputs over N, H, W per channel, as
    ``torch.nn.BatchNorm2d``: ``weight`` ones and ``bias`` zeros (omitted with
    ``affine=False``); buffers ``running_mean`` (zeros) and ``running_var`` (ones) in the
    parameter format (omitted with ``track_running_stats=False``, which then normalises with
    batch statistics in eval mode too). Training mode updates the buffers with ``momentum``
    (a number in [0, 1]; PyTorch's cumulative average, momentum=None, is not offered);
    ``eps`` is a number > 0. The buffer ``num_batches_tracked`` (a scalar, 0 at first, with
    the running statistics) counts the training-mode forward passes, as PyTorch's: a
    whole number, held exactly in float64 (PyTorch's is int64), loaded only as one."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True):
        super().__init__()
        self.num_features = check_count("num_features", num_features, 1)
        self.eps = check_between("eps", eps, 0.0, low_open=True)
        if momentum is None:
            raise ValueError("BatchNorm2d: momentum=None (a cumulative average) is not "
                             "supported; give a number")
        self.momentum = check_between("momentum", momentum, 0.0, 1.0)     # torch's meaning
        affine = check_flag("affine", affine)
        self.track_running_stats = check_flag("track_running_stats", track_running_stats)
        shape = (self.num_features,)
        self.weight = parameter(init.ones(shape)) if affine else None
        self.bias = parameter(init.zeros(shape)) if affine else None
        stats = self.track_running_stats
        fmt = ag.current_policy().param
        self.register_buffer("running_mean", ag.Tensor(init.zeros(shape), fmt) if stats else None)
        self.register_buffer("running_var", ag.Tensor(init.ones(shape), fmt) if stats else None)
        self.register_buffer("num_batches_tracked",
                             ag.Tensor(init.zeros(()), ag.FP64) if stats else None)

    def check_loaded(self, name: str, values) -> None:
        """A loaded ``running_var`` is a variance: a negative one would give NaN outputs;
        ``num_batches_tracked`` a count."""
        if name == "running_var" and xp.any(values < 0):
            raise ValueError(f"running_var is a variance and must be >= 0, got "
                             f"{float(xp.min(values))}")
        if name == "num_batches_tracked" and (values < 0 or values != xp.floor(values)):
            raise ValueError(f"num_batches_tracked counts batches and must be a whole number "
                             f">= 0, got {float(values)}")

    def forward(self, x):
        x = ag.as_tensor(x)
        if x.ndim != 4:
            raise ValueError(f"BatchNorm2d expects input (N, C, H, W), got shape {x.shape}")
        out = ag.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=self.training or not self.track_running_stats,
                            momentum=self.momentum, eps=self.eps)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.data = xp.add(self.num_batches_tracked.data, 1.0)
        return out

    def __repr__(self) -> str:
        return (f"BatchNorm2d({self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.weight is not None}, "
                f"track_running_stats={self.track_running_stats})")
