"""The optimizer step as a chain of transforms: optax's ``chain`` of ``(init, update)``
pairs, with frozen states as in jmp.

A transform is a frozen config with two functions::

    init(named) -> state                           # a NamedTuple, never changed in place
    update(step, state, params) -> (step, state)   # a new StepData and a new state

``named``: the parameters as (name, ``Tensor``) pairs; ``step`` (``StepData``) carries the
gradients and what the step has found so far; ``params`` (``Params``) the parameters and the
values the rule updates. ``chain(*transforms)`` is itself a transform: it runs them in order
and stops after the first that marks the step skipped, the later ones' states staying as they
were (optax's ``apply_if_finite``, jmp's ``select_tree(finite, new, old)``).
``Optimizer.step`` runs::

    chain(find_overflow(),                    # found_inf, the scaler's next state
          skip_on_overflow(),                 # stop where that state skips the step
          unscale_gradients(),                # grads * inv_scale as the framework does it
          measure_global_norm(),              # fp32 L2 norm, correctly rounded
          clip_by_global_norm(clip_norm),     # only with clip_norm (torch's rule)
          *extra,                             # the user's transforms (Optimizer(extra=)),
          check_gradients(),                  # then a check of their gradients (updates.py)
          apply_rule(rule, master_fmt),       # new stored values; state: count, rule states
          count_lost_updates(),               # moved and lost elements
          store_values(master_fmt))           # state: the new master copies (or weights)

The chain is pure: it returns the new step data and states and touches no ``Tensor``; the
weights are written afterwards, as optax's ``apply_updates`` does, by
``fpsim.optim.updates.apply_updates`` (``Optimizer.step`` calls it unless the step was
skipped).

>>> from fpsim.backend import xp
>>> from fpsim.scaling import preset
>>> chained = chain(find_overflow(), skip_on_overflow(), unscale_gradients())
>>> scaler_state = preset("torch", init_scale=1024.0).init()
>>> overflowed = StepData.of([xp.asarray([2048.0, xp.inf], xp.float32)], scaler_state)
>>> step, _ = chained.update(overflowed, chained.init(()))
>>> step.found_inf, step.skipped, step.next_scaler_state.scale, step.grads[0].tolist()
(True, True, 512.0, [2048.0, inf])
>>> step, _ = chained.update(StepData.of([xp.asarray([2048.0], xp.float32)], scaler_state),
...                          chained.init(()))
>>> step.found_inf, step.skipped, step.grads[0].tolist()
(False, False, [2.0])
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from ..backend import copy, name as backend_in_use, round_to, scalar, size, xp
from ..exact import global_norm
from ..formats import Format, get
from ..options import check_float32
from ..scaling import check_overflow, found_inf, unscale
from .arith import Arith
from .flat import Joined, join, split
from .rules import Update

__all__ = ["StepData", "Params", "EmptyState", "Chain", "chain", "find_overflow",
           "skip_on_overflow", "unscale_gradients", "measure_global_norm",
           "clip_by_global_norm", "apply_rule", "count_lost_updates",
           "store_values", "RuleState", "StoredValues", "FindOverflow", "SkipOnOverflow",
           "UnscaleGradients", "MeasureGlobalNorm", "ClipByGlobalNorm",
           "ApplyRule", "CountLostUpdates", "StoreValues", "arith_of",
           "overflow_test_is_elementwise"]


class StepData(NamedTuple):
    """What one step has so far. ``grads``: float32 gradients in the update's layout (one
    per parameter, or one flat array where all parameters update together, ``Params``);
    ``scaled``: one per parameter as the backward pass left them (the overflow test that
    sums each gradient reads these). ``new``: the rule's new stored values and ``results``
    its ``Update`` s, in the layout."""

    grads: tuple
    scaled: tuple
    scaler_state: object = None       # None: no loss scaling
    found_inf: bool = False
    next_scaler_state: object = None
    skipped: bool = False
    grad_norm: object = None          # a 0-d float32 value, once measured
    clipped: bool = False
    new: tuple = ()
    results: tuple = ()
    updates: int = 0
    lost_updates: int = 0
    per_parameter: bool = False       # also count updates and lost ones parameter by parameter
    lost_by_parameter: tuple = ()     # ((updates, lost), ...) in parameter order, when asked

    @classmethod
    def of(cls, grads, scaler_state=None) -> "StepData":
        """A step's start: the gradients, one per parameter, in that layout."""
        grads = tuple(grads)
        return cls(grads, grads, scaler_state)


class Params(NamedTuple):
    """What the rule updates: the parameters (``Tensor`` s), the values it reads and
    replaces (``stored``: the master copies, or the weights without a master), and the
    layout: ``together`` None where there is one array per parameter, else the update's
    format, ``stored`` and the gradients then being one flat array (``fpsim.optim.flat``)."""

    tensors: tuple
    stored: tuple
    together: "Format | None" = None


class EmptyState(NamedTuple):
    """The state of a transform that keeps none."""


@dataclass(frozen=True)
class Chain:
    """``transforms`` run in order; a skipped step stops the chain (later states kept)."""

    transforms: tuple

    def init(self, named) -> tuple:
        return tuple(t.init(named) for t in self.transforms)

    def update(self, step: StepData, state: tuple, params: "Params | None" = None):
        states = list(state)
        for i, transform in enumerate(self.transforms):
            result = transform.update(step, states[i], params)
            if not (type(result) is tuple and len(result) == 2
                    and isinstance(result[0], StepData)):
                raise TypeError(f"{type(transform).__name__}.update must return a pair "
                                f"(step, state) with step a StepData (step._replace(...)), "
                                f"got {_kinds(result)}")
            step, states[i] = result
            if step.skipped:
                break
        return step, tuple(states)

    def index(self, kind) -> int:
        """The position of the (first) transform of type ``kind``, its state's in ``init``."""
        return next(i for i, t in enumerate(self.transforms) if isinstance(t, kind))


def _kinds(result) -> str:
    if type(result) is tuple:
        return "(" + ", ".join(type(item).__name__ for item in result) + ")"
    return type(result).__name__


def chain(*transforms) -> Chain:
    return Chain(tuple(transforms))


class Stateless:
    """A transform that keeps no state."""

    def init(self, named) -> EmptyState:
        return EmptyState()


def overflow_test_is_elementwise(scaler_state) -> bool:
    """Whether the overflow test looks at each element alone (any inf or NaN, scaled or
    unscaled), so that it gives the same answer on the joined flat gradient; the "sum" test
    sums each gradient on its own."""
    return scaler_state is None or scaler_state.scaler.overflow_check == "nonfinite"


@dataclass(frozen=True)
class FindOverflow(Stateless):
    """``found_inf``: the scaler's overflow test (``fpsim.scaling.check_overflow``) and
    ``next_scaler_state = scaler_state.update(found_inf)``; without a scaler, whether any
    element is inf or NaN (reported, nothing skipped).

    >>> from fpsim.backend import xp
    >>> step = StepData.of([xp.asarray([1.0, xp.nan], xp.float32)])
    >>> find_overflow().update(step, EmptyState())[0].found_inf
    True
    """

    def update(self, step, state, params=None):
        scaler_state = step.scaler_state
        if scaler_state is None:
            return step._replace(found_inf=found_inf(step.grads)), state
        grads = step.grads if overflow_test_is_elementwise(scaler_state) else step.scaled
        found = check_overflow(grads, scaler_state)
        return step._replace(found_inf=found, next_scaler_state=scaler_state.update(found)), state


@dataclass(frozen=True)
class SkipOnOverflow(Stateless):
    """``skipped``: the scaler's next state skips this step (never without a scaler)."""

    def update(self, step, state, params=None):
        following = step.next_scaler_state
        if following is not None and following.skipped:
            return step._replace(skipped=True), state
        return step, state


@dataclass(frozen=True)
class UnscaleGradients(Stateless):
    """``grads`` divided by the loss scale as the scaler's framework does it
    (``fpsim.scaling.unscale``); new arrays except at scale 1, the inputs never written.

    >>> from fpsim.backend import xp
    >>> from fpsim.scaling import preset
    >>> step = StepData.of([xp.asarray([3.0], xp.float32)], preset("torch", init_scale=4.0)
    ...                    .init())
    >>> unscale_gradients().update(step, EmptyState())[0].grads
    (array([0.75], dtype=float32),)
    """

    def update(self, step, state, params=None):
        if step.scaler_state is None:
            return step, state
        return step._replace(grads=unscale(step.grads, step.scaler_state, copy=False)), state


@dataclass(frozen=True)
class MeasureGlobalNorm(Stateless):
    """``grad_norm``: fp32(sqrt(exact sum of the squares of all gradients)), correctly
    rounded (``fpsim.exact.global_norm``)."""

    def update(self, step, state, params=None):
        return step._replace(grad_norm=global_norm(step.grads)), state


@dataclass(frozen=True)
class ClipByGlobalNorm(Stateless):
    """``torch.nn.utils.clip_grad_norm_``, in fp32: ``coef = max_norm / (norm + 1e-6)``;
    where ``coef < 1`` every gradient is multiplied by it (one fp32 rounding) and
    ``clipped``; a coefficient of 1 or more leaves them as they are. The norm is the one
    measured before, or measured here.

    >>> from fpsim.backend import xp
    >>> step = StepData.of([xp.asarray([3.0, 4.0], xp.float32)])
    >>> step = clip_by_global_norm(1.0).update(step, EmptyState())[0]
    >>> float(step.grad_norm), step.clipped, step.grads[0].tolist()
    (5.0, True, [0.5999999046325684, 0.7999998331069946])
    """

    max_norm: float

    def __post_init__(self) -> None:
        check_float32("clip_norm", self.max_norm, 0.0, low_open=True)

    def update(self, step, state, params=None):
        norm = global_norm(step.grads) if step.grad_norm is None else step.grad_norm
        coef = scalar(self.max_norm, xp.float32) / (norm + scalar(1e-6, xp.float32))
        if not coef < 1:
            return step._replace(grad_norm=norm), state
        grads = tuple(xp.asarray(g, xp.float32) * coef for g in step.grads)
        return step._replace(grads=grads, grad_norm=norm, clipped=True), state


class RuleState(NamedTuple):
    """``count``: steps applied (the rule's step number, skipped steps not counted);
    ``states``: the rule's state of each parameter; ``flat``: where the last step updated
    all parameters together, the rule's state of that flat update, ``states`` being views
    of it (else None)."""

    count: int
    states: tuple
    flat: tuple | None = None


@dataclass(frozen=True)
class ApplyRule:
    """``new = rule(stored, grads)`` in the update's format: the master format, or each
    weight's own without a master (``master_fmt`` None), with ``Arith``'s one rounding per
    operation; ``results``: the rule's ``Update`` s. State: ``RuleState``.

    >>> from fpsim.backend import xp
    >>> from fpsim.optim import SGD
    >>> from fpsim.autograd import Tensor
    >>> w = Tensor(xp.asarray([1.0], xp.float32), "fp16")
    >>> rule = apply_rule(SGD(lr=0.5), None)
    >>> step, state = rule.update(StepData.of([xp.asarray([2.0 ** -9], xp.float32)]),
    ...                           rule.init([("w", w)]), Params((w,), (w.data,)))
    >>> step.new[0].tolist(), state.count
    ([0.9990234375], 1)
    """

    rule: object
    master_fmt: "Format | str | None"

    def __post_init__(self) -> None:
        object.__setattr__(self, "master_fmt", _format_or_none(self.master_fmt))

    def init(self, named) -> RuleState:
        return RuleState(0, tuple(self.rule.init(p.data) for _, p in named))

    def update(self, step, state: RuleState, params: Params):
        count = state.count + 1
        if params.together is not None:
            flat_state = state.flat
            if flat_state is None:
                template = state.states[0]
                flat_state = type(template)(*(None if field[0] is None else join(field)
                                              for field in zip(*state.states)))
            result: Update = self.rule.apply(arith_of(params.together), params.stored[0],
                                             step.grads[0], flat_state, count)
            new = _one_dimensional(xp.asarray(result.param, xp.float32))
            flats = type(result.state)(*(None if v is None else _one_dimensional(v)
                                         for v in result.state))
            shapes = [p.shape for p in params.tensors]
            fields = [(None,) * len(shapes) if v is None else split(v, shapes).parts
                      for v in flats]
            states = tuple(type(result.state)(*values) for values in zip(*fields))
            return (step._replace(new=(new,), results=(result,)),
                    RuleState(count, states, flats))
        new, results, states = [], [], []
        for p, stored, grad, rule_state in zip(params.tensors, params.stored, step.grads,
                                               state.states):
            ops = arith_of(self.master_fmt if self.master_fmt is not None else p.fmt)
            result = self.rule.apply(ops, stored, grad, rule_state, count)
            new.append(xp.reshape(xp.asarray(result.param, xp.float32), p.shape))
            results.append(result)
            states.append(result.state)
        return (step._replace(new=tuple(new), results=tuple(results)),
                RuleState(count, tuple(states)))


@dataclass(frozen=True)
class CountLostUpdates(Stateless):
    """``updates``: elements whose intended increment (``Update.intended``) is nonzero;
    ``lost_updates``: those of them whose stored value did not change (an update below half
    an ulp of its weight)."""

    def update(self, step, state, params: Params):
        updates = lost = 0
        for result, new, stored in zip(step.results, step.new, params.stored):
            moved, kept = result.tally(new, stored)
            updates, lost = updates + moved, lost + kept
        step = step._replace(updates=updates, lost_updates=lost)
        if step.per_parameter:
            step = step._replace(lost_by_parameter=_tally_each(step, params))
        return step, state


def _tally_each(step, params: Params) -> tuple:
    """((updates, lost), ...) per parameter: the rule's own counts where it updated each
    parameter alone, else each parameter's slice of the flat update (``new`` is a new array,
    so ``stored`` still holds the values before the step)."""
    if params.together is None:
        return tuple(result.tally(new, stored)
                     for result, new, stored in zip(step.results, step.new, params.stored))
    result, new, stored = step.results[0], step.new[0], params.stored[0]
    moved = xp.reshape(result.moved(), (-1,))
    kept = xp.logical_and(moved, xp.equal(xp.reshape(new, (-1,)),
                                          xp.reshape(xp.asarray(stored), (-1,))))
    counts, start = [], 0
    for tensor in params.tensors:
        stop = start + size(tensor.data)
        counts.append((int(xp.count_nonzero(moved[start:stop])),
                       int(xp.count_nonzero(kept[start:stop]))))
        start = stop
    return tuple(counts)


class StoredValues(NamedTuple):
    """``values``: the master copies (with a master), or the weights' new values (without
    one); ``flat``: the flat array they are views of after a step that updated all
    parameters together (else None)."""

    values: tuple
    flat: object = None

    @property
    def joined(self) -> Joined:
        return Joined(self.values, self.flat)


@dataclass(frozen=True)
class StoreValues:
    """The new stored values, one array per parameter (split from the flat update where all
    parameters went together), become the state: the master copies, or without a master
    (``master_fmt`` None) the weights' new values. Pure: the weights are written from this
    state by ``fpsim.optim.updates.apply_updates``. ``init`` checks that every weight fits
    the master format and copies it there.

    >>> from fpsim.backend import xp
    >>> from fpsim.autograd import Tensor
    >>> w = Tensor(xp.asarray([1.0], xp.float32), "bf16")
    >>> master = store_values("fp32")
    >>> step = StepData.of([])._replace(new=(xp.asarray([1.00390625], xp.float32),))
    >>> _, state = master.update(step, master.init([("w", w)]), Params((w,), ()))
    >>> state.values[0].tolist(), w.data.tolist()          # the weight is not written here
    ([1.00390625], [1.0])
    """

    master_fmt: "Format | str | None"

    def __post_init__(self) -> None:
        object.__setattr__(self, "master_fmt", _format_or_none(self.master_fmt))

    def init(self, named) -> StoredValues:
        if self.master_fmt is None:
            return StoredValues(())
        masters = []
        for name, p in named:
            widened = round_to(xp.asarray(p.data, xp.float32), self.master_fmt)
            if not xp.array_equal(widened, p.data, equal_nan=True):
                raise ValueError(f"parameter {name!r} ({p.fmt}) does not fit the master "
                                 f"format {self.master_fmt}; pick a wider master")
            masters.append(copy(widened))
        return StoredValues(tuple(masters))

    def stored(self, state: StoredValues, tensors) -> tuple:
        """The values the rule updates: the master copies, or the weights themselves."""
        return state.values if self.master_fmt is not None else tuple(p.data for p in tensors)

    def update(self, step, state, params: Params):
        if params.together is None:
            return step, StoredValues(tuple(step.new))
        flat = step.new[0]
        return step, StoredValues(split(flat, [p.shape for p in params.tensors]).parts, flat)


# optax's spelling: the lower-case names build the transforms (the classes are the types
# ``Chain.index`` looks for)
find_overflow = FindOverflow
skip_on_overflow = SkipOnOverflow
unscale_gradients = UnscaleGradients
measure_global_norm = MeasureGlobalNorm
clip_by_global_norm = ClipByGlobalNorm
apply_rule = ApplyRule
count_lost_updates = CountLostUpdates
store_values = StoreValues


def _one_dimensional(array):
    return array if array.ndim == 1 else xp.reshape(array, (-1,))


def _format_or_none(fmt) -> "Format | None":
    return None if fmt is None else get(fmt)


def arith_of(fmt: Format) -> Arith:
    """The ``Arith`` of ``fmt`` on the current backend (one per format: it holds only
    constants of the format)."""
    return _arith(backend_in_use(), fmt)


@lru_cache(maxsize=None)
def _arith(backend_name: str, fmt: Format) -> Arith:
    return Arith(fmt)
