"""fpsim: a bit-exact NumPy reference simulator of reduced-precision training.

Layers, lowest first: ``formats`` (what a number type is), ``rounding`` (values to a format),
``encoding`` (values to bit patterns and back), ``describe`` (a value taken apart, for
teaching), ``scaling`` (loss scalers and framework presets), ``train`` (traces, checkpoints).
"""
from . import formats, scaling
from ._version import __version__
from .describe import Description, describe
from .encoding import decode, encode
from .formats import Format, custom
from .rounding import MODES, round_to
from .scaling import DynamicScaler, LossScaleMinimumError, NoScaler, ScalerState, StaticScaler

__all__ = ["__version__", "formats", "Format", "custom", "round_to", "MODES", "encode",
           "decode", "describe", "Description", "scaling", "ScalerState", "DynamicScaler",
           "StaticScaler", "NoScaler", "LossScaleMinimumError"]
