"""Normalisation layers: ``LayerNorm``.

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
"""
from __future__ import annotations

from .. import autograd as ag
from ..options import check_count, check_real
from . import init
from .module import Module, parameter

__all__ = ["LayerNorm"]


class LayerNorm(Module):
    """Normalises over the trailing ``normalized_shape`` axes; ``weight`` ones and ``bias``
    zeros (PyTorch's init), both omitted with ``elementwise_affine=False``, the bias alone
    with ``bias=False``."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        shape = ((normalized_shape,) if not isinstance(normalized_shape, (tuple, list))
                 else tuple(normalized_shape))
        self.normalized_shape = tuple(check_count("normalized_shape", n, 1) for n in shape)
        self.eps = check_real("eps", eps)
        self.weight = parameter(init.ones(shape)) if elementwise_affine else None
        self.bias = parameter(init.zeros(shape)) if elementwise_affine and bias else None

    def forward(self, x):
        return ag.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def __repr__(self) -> str:
        return (f"LayerNorm({self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.weight is not None})")
