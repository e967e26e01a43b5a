"""Update rules: SGD (momentum, Nesterov, weight decay) and Adam / AdamW.

Each rule is a frozen config with ``init(param) -> state`` and
``apply(ops, param, grad, state, step) -> Update``, where ``ops`` is the ``Arith`` of the
format the update is computed in (the master format, or the weights' own format without a
master copy). The order of operations and the fused ones are PyTorch's single-tensor
implementations (``torch/optim/sgd.py`` ``_single_tensor_sgd``, ``torch/optim/adam.py``
``_single_tensor_adam``), so with fp32 arithmetic the bits are torch's on a CPU with FMA
(tests compare against ``torch.optim`` on CPU). Python-float hyperparameters reach the kernels
as values of the format, as torch's ``alpha``/``value`` arguments do.
"""
from __future__ import annotations

import math
from numbers import Real
from dataclasses import dataclass, fields
from typing import NamedTuple, SupportsFloat

from ..backend import copy, scalar, xp
from ..options import check_flag, check_float32

from .arith import Arith

__all__ = ["SGD", "Adam", "AdamW", "Update"]

# The hyperparameters are checked with ``check_float32``: every update computes in a format no
# wider than float32, so a value float32 turns into a refused one (1e-50 -> 0) is refused too.


class Update(NamedTuple):
    """A rule's result for one parameter: the new stored values, the increment the rule meant
    to add as ``factor * direction`` (where it is nonzero but the stored value did not
    change, the update was lost), and the rule's new state. ``factor`` and ``direction`` are
    values of the update's format (a scalar and an array). ``counts``: (moved, lost), the
    number of elements with a nonzero increment and of those whose stored value did not
    change, where the rule counted them itself (``Arith.fma_counted``), else None."""

    param: xp.ndarray
    direction: xp.ndarray
    factor: SupportsFloat   # a 0-d float32 value (``fpsim.backend.scalar``)
    state: tuple
    counts: tuple[int, int] | None = None

    @property
    def intended(self) -> xp.ndarray:
        """The increment, exact in float64: two values of a format of at most 24 bits within
        fp32's exponent range multiply exactly (at most 48 bits, between 2**-298 and
        2**256)."""
        return xp.asarray(self.factor, xp.float64) * xp.asarray(self.direction, xp.float64)

    def moved(self) -> xp.ndarray:
        """``intended != 0``, without forming it: the exact product is zero only where a
        factor is zero and the other finite (inf * 0 is NaN)."""
        direction = xp.asarray(self.direction)
        if not math.isfinite(self.factor):
            return xp.ones(direction.shape, xp.bool_)
        if self.factor == 0:
            return xp.logical_not(xp.isfinite(direction))
        return direction != 0

    def tally(self, new, stored) -> tuple[int, int]:
        """(elements the rule meant to move, those of them whose stored value did not change
        from ``stored`` to ``new``): ``counts`` where the rule counted them itself."""
        if self.counts is not None:     # counted by the rule, against the same stored values
            return self.counts
        moved = xp.reshape(self.moved(), (-1,))
        kept = xp.equal(xp.reshape(new, (-1,)), xp.reshape(xp.asarray(stored), (-1,)))
        return (int(xp.count_nonzero(moved)),
                int(xp.count_nonzero(xp.logical_and(moved, kept, out=kept))))



def _plain_numbers(rule) -> None:
    """Store NumPy scalars among a frozen rule's fields as Python floats (the hyperparameters
    go into run.json and checkpoints, which hold Python numbers only)."""
    for field in fields(rule):
        value = getattr(rule, field.name)
        if isinstance(value, Real) and not isinstance(value, (int, float)):
            object.__setattr__(rule, field.name, float(value))


class MomentumState(NamedTuple):
    momentum_buffer: xp.ndarray | None


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent, torch's order of operations::

        d = grad
        if weight_decay: d = fma(weight_decay, param, d)          # d.add(param, alpha=wd)
        if momentum:
            buf = d on the first step, else fma(1 - dampening, d, momentum * buf)
            d = fma(momentum, buf, d) if nesterov else buf
        param = fma(-lr, d, param)                                # param.add_(d, alpha=-lr)

    >>> import numpy as np
    >>> rule, ops = SGD(lr=0.5), Arith("fp16")
    >>> rule.apply(ops, np.float32([1.0]), np.float32([2.0 ** -11]), rule.init(None), 1).param
    array([1.], dtype=float32)
    """

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _plain_numbers(self)
        check_float32("lr", self.lr, 0.0, low_open=True)
        check_float32("momentum", self.momentum, 0.0)
        check_float32("dampening", self.dampening, 0.0)
        check_float32("weight_decay", self.weight_decay, 0.0)
        object.__setattr__(self, "nesterov", check_flag("nesterov", self.nesterov))
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")

    def init(self, param) -> MomentumState:
        return MomentumState(None)

    def apply(self, ops: Arith, param, grad, state: MomentumState, step: int) -> Update:
        d = grad
        if self.weight_decay:
            d = ops.fma(ops.scalar(self.weight_decay), param, d)
        buffer = state.momentum_buffer
        if self.momentum:
            if buffer is None:
                buffer = xp.array(d, xp.float32)
            else:
                decayed = ops.mul(buffer, ops.scalar(self.momentum))
                buffer = ops.fma(ops.scalar(1.0 - self.dampening), d, decayed)
            d = ops.fma(ops.scalar(self.momentum), buffer, d) if self.nesterov else buffer
        minus_lr = ops.scalar(-self.lr)
        if xp.asarray(d).dtype != xp.float32:   # counts need exact float64 products
            return Update(ops.fma(minus_lr, d, param), d, minus_lr, MomentumState(buffer))
        new, moved, lost = ops.fma_counted(minus_lr, d, param)
        return Update(new, d, minus_lr, MomentumState(buffer), (moved, lost))


class AdamState(NamedTuple):
    exp_avg: xp.ndarray
    exp_avg_sq: xp.ndarray


@dataclass(frozen=True)
class Adam:
    """Adam (``decoupled=False``) and AdamW (``decoupled=True``), torch's order::

        if weight_decay: param = param * (1 - lr * wd)    (AdamW)
                         grad = fma(wd, param, grad)       (Adam)
        m = lerp(m, grad, 1 - beta1)                       # fused, see Arith.lerp
        v = fma((1 - beta2) * grad, grad, v * beta2)       # v.mul_(b2).addcmul_(g, g, 1-b2)
        step_size = lr / (1 - beta1**t);  c2 = sqrt(1 - beta2**t)     (Python floats)
        denom = sqrt(v) / c2 + eps                         # three roundings
        param = param + (-step_size * m) / denom           # addcdiv_: not fused

    ``sqrt`` is correctly rounded here. PyTorch's CPU ``sqrt`` is not on every machine
    (measured: +-1 ulp on 18% of float32 inputs on an AVX-512 build), so torch's Adam bits
    depend on the machine; with a correctly rounded sqrt substituted, they are these.
    """

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def __post_init__(self) -> None:
        _plain_numbers(self)
        check_float32("lr", self.lr, 0.0, low_open=True)
        check_float32("beta1", self.beta1, 0.0, 1.0, high_open=True)
        check_float32("beta2", self.beta2, 0.0, 1.0, high_open=True)
        check_float32("eps", self.eps, 0.0, low_open=True)
        check_float32("weight_decay", self.weight_decay, 0.0)
        object.__setattr__(self, "decoupled", check_flag("decoupled", self.decoupled))

    def init(self, param) -> AdamState:
        zeros = xp.zeros(xp.shape(param), xp.float32)
        return AdamState(zeros, copy(zeros))

    def apply(self, ops: Arith, param, grad, state: AdamState, step: int) -> Update:
        if self.weight_decay:
            if self.decoupled:
                param = ops.mul(param, ops.scalar(1.0 - self.lr * self.weight_decay))
            else:
                grad = ops.fma(ops.scalar(self.weight_decay), param, grad)
        exp_avg = ops.lerp(state.exp_avg, grad, 1.0 - self.beta1)
        scaled_grad = ops.mul(ops.scalar(1.0 - self.beta2), grad)
        exp_avg_sq = ops.fma(scaled_grad, grad, ops.mul(state.exp_avg_sq, ops.scalar(self.beta2)))
        step_size = self.lr / (1.0 - self.beta1 ** step)
        correction2_sqrt = math.sqrt(1.0 - self.beta2 ** step)  # torch: _dispatch_sqrt
        denom = ops.add(ops.div(ops.sqrt(exp_avg_sq), ops.scalar(correction2_sqrt)),
                        ops.scalar(self.eps))
        increment = ops.div(ops.mul(ops.scalar(-step_size), exp_avg), denom)
        new_param = ops.add(param, increment)
        return Update(new_param, increment, scalar(1.0, xp.float32),
                      AdamState(exp_avg, exp_avg_sq))


def AdamW(lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> Adam:
    """Adam with decoupled weight decay (torch.optim.AdamW's defaults)."""
    return Adam(lr, beta1, beta2, eps, weight_decay, decoupled=True)
