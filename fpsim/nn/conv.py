"""Image layers (NCHW, as PyTorch): ``Conv2d``, ``MaxPool2d``, ``AvgPool2d``,
``AdaptiveAvgPool2d``, ``Flatten``, ``Unflatten``; ``Conv1d`` (NCL) on the same machinery.

Each calls one autograd op (``fpsim.autograd.conv2d``, ``max_pool2d``, ``avg_pool2d``,
``reshape``), whose module docs say where it rounds; parameters are created in the current
policy's ``param`` format.

>>> import numpy as np
>>> from fpsim.autograd import Tensor
>>> layer = Conv2d(3, 8, 3, padding=1, rng=0)
>>> [(name, p.shape) for name, p in layer.named_parameters()]
[('weight', (8, 3, 3, 3)), ('bias', (8,))]
>>> y = Flatten()(MaxPool2d(2)(layer(Tensor(np.ones((2, 3, 6, 6))))))
>>> y.shape
(2, 72)
"""
from __future__ import annotations

import math

from numbers import Integral

from ..options import check_count, check_instance

from .. import autograd as ag
from ..autograd.ops_conv import pair
from . import init
from .module import Module, parameter

__all__ = ["Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten",
           "Unflatten"]


class Conv2d(Module):
    """``autograd.conv2d`` with weight (out, in/groups, kh, kw) and bias (out,), both drawn
    U(+-1/sqrt(fan_in)), fan_in = in/groups kh kw: PyTorch's default (``kaiming_uniform_``
    with a = sqrt(5) for the weight, the same bound for the bias)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, *, rng=None,
                 accumulation=None):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride, self.dilation = pair(stride, "stride", 1), pair(dilation, "dilation", 1)
        self.padding = pair(padding, "padding", 0)
        _weight_and_bias(self, "Conv2d", in_channels, out_channels, groups, self.kernel_size,
                         bias, rng, accumulation)

    def forward(self, x):
        return ag.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                         self.groups, accumulation=self.accumulation)

    def __repr__(self) -> str:
        return (f"Conv2d({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, fmt={self.weight.fmt})")


class Conv1d(Module):
    """``torch.nn.Conv1d``: x (N, C, L), weight (out, in/groups, k), bias (out,), drawn as
    ``Conv2d``'s (U(+-1/sqrt(fan_in)), fan_in = in/groups k, weight then bias). It runs
    ``autograd.conv2d`` on the height-1 image (N, C, 1, L) with weight (out, in/groups, 1, k):
    the same products, summed in the same (channel, tap) order by the same accumulation,
    so the bits of a direct 1-D convolution under every policy; the reshapes round
    nothing."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True, *,
                 rng=None, accumulation=None):
        super().__init__()
        self.kernel_size = _single(kernel_size, "kernel_size", 1)
        self.stride, self.dilation = _single(stride, "stride", 1), _single(dilation, "dilation", 1)
        self.padding = _single(padding, "padding", 0)
        _weight_and_bias(self, "Conv1d", in_channels, out_channels, groups, (self.kernel_size,),
                         bias, rng, accumulation)

    def forward(self, x):
        x = ag.as_tensor(x)
        if x.ndim != 3 or x.shape[1] != self.in_channels:
            raise ValueError(f"Conv1d expects input (N, {self.in_channels}, L), got shape "
                             f"{x.shape}")
        image = ag.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
        kernel = ag.reshape(self.weight, self.weight.shape[:2] + (1, self.kernel_size))
        out = ag.conv2d(image, kernel, self.bias, (1, self.stride), (0, self.padding),
                        (1, self.dilation), self.groups, accumulation=self.accumulation)
        return ag.reshape(out, (out.shape[0], out.shape[1], out.shape[3]))

    def __repr__(self) -> str:
        return (f"Conv1d({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, fmt={self.weight.fmt})")


def _weight_and_bias(layer, kind: str, in_channels, out_channels, groups, kernel: tuple, bias,
                     rng, accumulation) -> None:
    """The checked channels and groups, and a convolution's parameters as torch draws them:
    U(+-1/sqrt(fan_in)), fan_in = in/groups times the kernel's size, weight then bias."""
    check_count("in_channels", in_channels, 1)
    check_count("out_channels", out_channels, 1)
    check_count("groups", groups, 1)
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"{kind}: groups={groups} must divide in_channels "
                         f"({in_channels}) and out_channels ({out_channels})")
    layer.in_channels, layer.out_channels, layer.groups = in_channels, out_channels, groups
    layer.accumulation = accumulation
    rng = init.as_rng(rng)
    fan_in = in_channels // groups * math.prod(kernel)
    shape = (out_channels, in_channels // groups) + kernel
    layer.weight = parameter(init.fan_in_uniform(rng, shape, fan_in))
    layer.bias = parameter(init.fan_in_uniform(rng, (out_channels,), fan_in)) if bias else None


def _single(value, name: str, minimum: int) -> int:
    """An int or a one-int tuple (PyTorch's Conv1d stores ``(k,)``), at least ``minimum``."""
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{name} takes an int or a tuple of one int, got {value!r}")
        value = value[0]
    return check_count(name, value, minimum)


class _Pool(Module):
    op = None

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = pair(kernel_size, "kernel_size", 1)
        self.stride = self.kernel_size if stride is None else pair(stride, "stride", 1)
        self.padding = pair(padding, "padding", 0)

    def forward(self, x):
        return type(self).op(x, self.kernel_size, self.stride, self.padding)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding})")


class MaxPool2d(_Pool):
    """``autograd.max_pool2d``: no rounding; gradient to the first maximal element."""

    op = staticmethod(ag.max_pool2d)


class AvgPool2d(_Pool):
    """``autograd.avg_pool2d``: window sum in fp32, divided by kh kw, rounded once."""

    op = staticmethod(ag.avg_pool2d)


class AdaptiveAvgPool2d(Module):
    """``autograd.adaptive_avg_pool2d`` to ``output_size`` (an int or (rows, columns)), as
    ``torch.nn.AdaptiveAvgPool2d``: (1, 1), global average pooling, is ``mean`` over H and W
    (PyTorch's route: one fp32 division by H W, rounded once); other sizes take PyTorch's
    windows ``[floor(i H / out), ceil((i + 1) H / out))``, overlapping where H is not a
    multiple, each window's fp32 sum divided by its height, then its width, rounded once."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = pair(output_size, "output_size", 1)

    def forward(self, x):
        return ag.adaptive_avg_pool2d(x, self.output_size)

    def __repr__(self) -> str:
        return f"AdaptiveAvgPool2d(output_size={self.output_size})"


class Flatten(Module):
    """Axes ``start_dim`` to the last joined into one (a reshape: no rounding)."""

    def __init__(self, start_dim: int = 1):
        super().__init__()
        check_count("start_dim", start_dim, 0)
        self.start_dim = start_dim

    def forward(self, x):
        if x.ndim <= self.start_dim:
            raise ValueError(f"Flatten(start_dim={self.start_dim}) needs more than "
                             f"{self.start_dim} axes, got shape {x.shape}")
        return ag.reshape(x, x.shape[:self.start_dim] + (-1,))

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim})"


class Unflatten(Module):
    """Axis ``dim`` (an int, negative from the end) split into ``unflattened_size`` (a tuple
    of positive ints, one of them may be -1), as ``torch.nn.Unflatten``: a reshape, no
    rounding."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim = int(check_instance("dim", dim, Integral, "an integer axis such as 1"))
        sizes = check_instance("unflattened_size", unflattened_size, (tuple, list),
                               "a tuple of sizes such as (3, 4)")
        if not sizes or sum(size == -1 for size in sizes) > 1:
            raise ValueError(f"unflattened_size must hold at least one size and at most one "
                             f"-1, got {unflattened_size!r}")
        self.unflattened_size = tuple(-1 if size == -1 and not isinstance(size, bool) else
                                      check_count("unflattened_size", size, 1)
                                      for size in sizes)

    def forward(self, x):
        if not -x.ndim <= self.dim < x.ndim:
            raise ValueError(f"Unflatten(dim={self.dim}) is out of range for shape {x.shape}")
        dim = self.dim % x.ndim
        return ag.reshape(x, x.shape[:dim] + self.unflattened_size + x.shape[dim + 1:])

    def __repr__(self) -> str:
        return f"Unflatten(dim={self.dim}, unflattened_size={self.unflattened_size})"
