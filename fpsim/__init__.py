"""fpsim: a bit-exact NumPy reference simulator of reduced-precision training.

Layers, lowest first: ``formats`` (what a number type is; beside it ``files``, atomic output files,
and ``options``, the checks every option goes through), ``rounding`` (values to a format),
``encoding`` (values to bit patterns and back), ``describe`` (a value taken apart, for teaching),
``backend`` (the kernel interface: where array libraries differ), ``exact`` (exact dot products and
sums rounded once, accumulation models, the gradient-underflow counter), ``quant`` (scaled FP8
quantization: per-tensor and block scales, their state), ``autograd`` (tensors, ops, precision
policies), ``nn`` (layers), ``optim`` (master-weight optimizers), ``scaling`` (loss scalers and
framework presets), ``train`` (traces, checkpoints); above them ``experiments``, ``plots``,
``conformance``, ``sweep`` (many training runs on Dask) and ``cli``. A module imports only from its
own layer or lower ones (``tests/test_layers.py``).
"""
from . import autograd, backend, conformance, exact, files, formats, nn, optim, scaling, sweep
from .autograd import (FP64, Policy, Tensor, current_policy, enable_grad, get_policy,
                       is_grad_enabled, no_grad, set_default_policy, use_policy)
from ._version import __version__
from .describe import Description, describe
from .encoding import decode, encode
from .formats import Format, custom
from .rounding import MODES, RoundingMode, round_to
from .optim import SGD, Adam, AdamW, Optimizer
from .scaling import DynamicScaler, LossScaleMinimumError, NoScaler, ScalerState, StaticScaler

__all__ = ["__version__", "formats", "Format", "custom", "round_to", "MODES", "RoundingMode",
           "encode", "decode", "describe", "Description", "scaling", "ScalerState", "DynamicScaler",
           "StaticScaler", "NoScaler", "LossScaleMinimumError", "autograd", "backend", "exact",
           "files", "nn", "optim", "Tensor", "Policy", "get_policy", "use_policy", "current_policy",
           "set_default_policy", "no_grad", "enable_grad", "is_grad_enabled", "FP64",
           "Optimizer", "SGD", "Adam", "AdamW", "conformance", "sweep"]
