"""Seeded initialisers: exact float64 draws from a ``numpy.random.Generator``.

Every function takes ``rng`` (a Generator, or an int seed for a fresh one) and returns a
float64 array; the parameter constructor rounds it once into the parameter's format. The same
seed gives the same bits on every machine (NumPy's PCG64 and its ``uniform``/``normal`` are
platform independent).

Defaults follow PyTorch's layer initialisation: ``Linear`` and ``LSTM`` draw
U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (``kaiming_uniform_`` with a = sqrt(5) gives exactly this
bound), ``Embedding`` draws N(0, 1).

>>> uniform(0, (2,), 0.5).round(4)
array([ 0.137 , -0.2302])
"""
from __future__ import annotations

import math

from ..backend import host_rng, is_generator, xp
from ..options import check_instance

__all__ = ["as_rng", "uniform", "normal", "zeros", "ones", "fan_in_uniform", "xavier_uniform"]


def as_rng(rng):
    """A host ``numpy.random.Generator`` from a Generator (returned as is), an int seed, or None
    (seed 0). Initial weights are drawn on the host for every backend (``backend.host_rng``)."""
    if rng is None:
        return host_rng(0)
    if is_generator(rng):
        return rng
    wanted = "a numpy.random.Generator or an int seed >= 0"
    check_instance("rng", rng, (int, xp.integer), wanted)
    if rng < 0:                                 # NumPy's seeds are non-negative
        raise ValueError(f"rng must be {wanted}, got {rng!r}")
    return host_rng(int(rng))


def uniform(rng, shape, bound: float) -> xp.ndarray:
    """U(-bound, bound)."""
    return as_rng(rng).uniform(-bound, bound, shape)


def normal(rng, shape, std: float = 1.0) -> xp.ndarray:
    return as_rng(rng).normal(0.0, std, shape)


def zeros(shape) -> xp.ndarray:
    return xp.zeros(shape)


def ones(shape) -> xp.ndarray:
    return xp.ones(shape)


def fan_in_uniform(rng, shape, fan_in: int) -> xp.ndarray:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's Linear/LSTM default."""
    return uniform(rng, shape, 1.0 / math.sqrt(fan_in))


def xavier_uniform(rng, shape, gain: float = 1.0) -> xp.ndarray:
    """Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) for a (out, in) weight."""
    fan_out, fan_in = shape[0], int(xp.prod(shape[1:]))
    return uniform(rng, shape, gain * math.sqrt(6.0 / (fan_in + fan_out)))
