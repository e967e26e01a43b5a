"""The autograd engine: tensors whose values live in a format, ops that round where
mixed-precision hardware and frameworks round, and reverse-mode autodiff whose gradients are
themselves stored in a format.

- ``Tensor`` (``tensor.py``): data, ``fmt``, ``grad_fmt``, ``requires_grad``, ``.grad``,
  ``backward``, ``detach``, ``zero_grad``, ``retain_grad``.
- Ops (``ops_*.py``), each beside its backward: ``add sub mul div neg pow exp log sqrt tanh
  sigmoid silu relu gelu leaky_relu elu``; ``matmul linear``; ``conv2d`` (``ops_conv.py``:
  im2col through the same accumulation); ``max_pool2d avg_pool2d adaptive_avg_pool2d``
  (``ops_pool.py``); ``layer_norm batch_norm group_norm`` (``ops_norm.py``); ``where
  masked_fill dropout`` (``ops_select.py``: masks); ``sum mean max softmax log_softmax``;
  ``reshape transpose getitem concatenate stack cast``; ``cross_entropy mse_loss``. The ops
  import ``tensor.py`` and register with it (``register``); ``Tensor``'s operators and methods call
  the registered ops. Their shared array-level accumulation: ``accumulate.py``.
- ``Policy`` / ``get_policy`` (``policy.py``): the format of each op category (autocast-like),
  from Lightning strings ("16-mixed", ...) or jmp strings ("params=fp32,compute=fp16,...").
- ``use_policy``, ``no_grad``, ``enable_grad`` (``context.py``).
- ``FP64``: the float64 reference mode's marker ("64-true"), for finite-difference checks.
- Dot-product accumulation models (``fpsim.exact.accumulation``, the layer below): ``matmul``,
  ``linear`` and ``sum`` take ``accumulation=``; the policy carries the default.

>>> from fpsim.autograd import Tensor, use_policy, matmul
>>> with use_policy("16-mixed"):
...     w = Tensor([[1.0, 2.0]], requires_grad=True)          # fp32, the "input" format
...     y = matmul(Tensor([[2.0 ** -20]]), w)                  # both cast to fp16
...     y.fmt.name, y.data
('fp16', array([[9.5367432e-07, 1.9073486e-06]], dtype=float32))
"""
from .tensor import Tensor, as_tensor
from .context import (current_policy, enable_grad, is_grad_enabled, no_grad,
                      set_default_policy, use_policy)
from .numerics import FP64
# Importing the ops modules registers them with Tensor (its operators and methods).
from .ops_elementwise import (add, div, elu, exp, gelu, leaky_relu, log, mul, neg, pow, relu,
                              sigmoid, silu, sqrt, sub, tanh)
from .ops_loss import cross_entropy, mse_loss
from .ops_matmul import linear, matmul
from .ops_fp8 import ScalingSlots
from .ops_conv import conv2d
from .ops_pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .ops_norm import batch_norm, group_norm, layer_norm
from .ops_select import dropout, masked_fill, where
from .ops_reduce import log_softmax, max, mean, softmax, sum
from .ops_shape import cast, concatenate, getitem, reshape, stack, transpose
from .policy import PRESETS, Policy, get_policy

__all__ = [
    "ScalingSlots",
    "Tensor", "as_tensor", "Policy", "get_policy", "PRESETS", "FP64",
    "current_policy", "use_policy", "set_default_policy", "no_grad", "enable_grad",
    "is_grad_enabled",
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "tanh", "sigmoid", "relu",
    "gelu", "silu", "leaky_relu", "elu", "where", "masked_fill", "dropout", "matmul", "linear",
    "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "layer_norm", "batch_norm",
    "group_norm",
    "sum", "mean", "max", "softmax", "log_softmax", "reshape",
    "transpose", "getitem", "concatenate", "stack", "cast", "cross_entropy", "mse_loss",
]
