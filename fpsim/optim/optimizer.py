"""The mixed-precision optimizer step: master weights, loss-scale handling, clipping, and an
account of every update that was lost.

One ``step(scaler_state)`` runs a chain of transforms (``fpsim.optim.transforms``), in order
(each rounding named)::

    grads  = [p.grad for p in params]            # in their formats (fp16 under "16-true")
    found  = scaler's overflow test on the scaled grads      (find_overflow)
    state  = scaler_state.update(found)          # skip? grow? back off?
    if state skipped: stop here, weights untouched                   (skip_on_overflow)
    grads  = float32(grads) * inv_scale          # exact widening; one fp32 rounding (unscale)
    norm   = fp32(sqrt(exact sum of squares))    # global L2 norm, correctly rounded
    if clip_norm and norm > clip_norm: grads *= fp32(clip_norm / (norm + 1e-6))   (torch)
    master = rule(master, grads) in the master format (fp32 by default)    (apply_rule)
    count the updates that did not change the stored value         (count_lost_updates)
    param  = round(master, param format)         # the working copy (apply_updates)

Without a master copy (``master=None``) the rule computes in each parameter's own format and
writes there directly: an update smaller than half an ulp of its weight is lost (for fp16,
weight/update ratios above 2048). ``StepReport`` counts lost updates every step.

Many small parameters are updated as one flat array (``fpsim.optim.flat``: elementwise rules
only), with the bits of one parameter at a time but for the sign of a NaN computed from two
NaNs of opposite signs.

>>> import numpy as np
>>> from fpsim.autograd import Tensor
>>> from fpsim.optim import SGD
>>> w = Tensor(np.float32([1.0, 1.0]), "fp16", requires_grad=True)
>>> w.grad = Tensor(np.float32([2.0 ** -9, 2.0 ** -14]), "fp16")
>>> report = Optimizer([w], SGD(lr=0.5), master=None).step()
>>> w.data.tolist(), report.lost_updates
([0.9990234375, 1.0], 1)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Iterable, NamedTuple

from ..autograd import Tensor
from ..backend import isdtype, scalar, xp
from ..formats import FP32, Format, get
from ..options import check_between, check_flag, check_instance, described
from ..scaling import ScalerState
from .flat import join, rejoin, together_format
from .transforms import (ApplyRule, Chain, RuleState, StepData, Params, StoreValues,
                         StoredValues, apply_rule, chain, clip_by_global_norm,
                         count_lost_updates, find_overflow, measure_global_norm,
                         skip_on_overflow, store_values, unscale_gradients)
from .updates import apply_updates, check_extra, check_gradients

__all__ = ["Optimizer", "StepReport"]


class StepReport(NamedTuple):
    """What one optimizer step did. ``lost_updates`` counts elements whose intended increment
    was nonzero but whose stored value (the master copy, or the weights without one) did not
    change; ``updates`` counts elements with a nonzero intended increment."""

    step: int
    found_inf: bool
    skipped: bool
    scale: float
    grad_norm: float
    clipped: bool
    updates: int
    lost_updates: int
    scaler_state: object
    #: ((updates, lost), ...) per parameter, in ``Optimizer.named`` order, where
    #: ``step(per_parameter=True)`` asked for them and the step was applied; else ()
    lost_by_parameter: tuple = ()

    @property
    def lost_fraction(self) -> float:
        return self.lost_updates / self.updates if self.updates else 0.0


class Optimizer:
    """Applies an update rule (``SGD``, ``Adam``) to parameters, keeping a master copy.

    ``params``: a ``Module`` (its named parameters) or an iterable of ``Tensor`` or
    ``(name, Tensor)``. ``master``: the master copy's format (default fp32), or None to
    update the weights in their own format (where the weights are in the master's format,
    after a step ``p.data`` is the master array itself, not a copy). ``clip_norm``: clip the
    global gradient norm after unscaling, as ``torch.nn.utils.clip_grad_norm_`` does.
    ``extra``: the user's own transforms, run in order after unscaling and clipping and
    before the rule, on one float32 gradient per parameter (``fpsim.optim.updates`` says
    what they get and may return). Here one that freezes a parameter by zeroing its
    gradient (its state, from ``init``, says which parameters it zeroes):

    >>> from dataclasses import dataclass
    >>> from fpsim.backend import xp
    >>> from fpsim.optim import SGD
    >>> @dataclass(frozen=True)
    ... class ZeroGradientOf:
    ...     name: str
    ...     def init(self, named):
    ...         return tuple(n == self.name for n, _ in named)
    ...     def update(self, step, state, params):
    ...         grads = tuple(xp.zeros_like(g) if zeroed else g
    ...                       for g, zeroed in zip(step.grads, state))
    ...         return step._replace(grads=grads), state
    >>> a, b = (Tensor(xp.ones(2, xp.float32), requires_grad=True) for _ in range(2))
    >>> opt = Optimizer([("a", a), ("b", b)], SGD(lr=0.5), extra=(ZeroGradientOf("a"),))
    >>> a.grad = b.grad = Tensor(xp.ones(2, xp.float32))
    >>> _ = opt.step()
    >>> a.data.tolist(), b.data.tolist()
    ([1.0, 1.0], [0.5, 0.5])

    ``transform`` is the chain of transforms a step runs (pure: the weights are written
    after it by ``apply_updates``) and ``chain_state`` their states (frozen: each step makes
    new ones); ``step_count``, ``states`` (the rule's state per parameter) and ``masters``
    (the master copies) are read from them. ``rule`` is read-only: ``set_learning_rate``
    changes the learning rate; another rule needs another optimizer.
    """

    def __init__(self, params, rule, *, master: "Format | str | None" = FP32,
                 clip_norm: float | None = None, extra: tuple = ()):
        self.named = _named(params)
        if not self.named:
            raise ValueError("the optimizer got no parameters")
        _check_rule(rule)
        extra = check_extra(extra)
        clipping = [] if clip_norm is None else [clip_by_global_norm(clip_norm)]
        checked = (*extra, check_gradients()) if extra else ()
        self._rule = rule
        self.clip_norm = clip_norm
        self.extra = extra
        self.master_fmt = _master_format(master)
        for name, p in self.named:
            _check_format(name, p)
        self.transform = chain(find_overflow(), skip_on_overflow(), unscale_gradients(),
                               measure_global_norm(), *clipping, *checked,
                               apply_rule(rule, self.master_fmt), count_lost_updates(),
                               store_values(self.master_fmt))
        self.chain_state = self.transform.init(self.named)
        self._tensors = tuple(p for _, p in self.named)
        self._rule_at = self.transform.index(ApplyRule)
        self._stored_at = self.transform.index(StoreValues)

    @property
    def rule(self):
        """The update rule the next step applies (read-only; see ``set_learning_rate``)."""
        return self._rule

    @rule.setter
    def rule(self, value) -> None:
        raise AttributeError("Optimizer.rule cannot be assigned (the chain and the rule's "
                             "states were built from it): call set_learning_rate(lr) to "
                             "change the learning rate, or build a new Optimizer for "
                             "another rule")

    @property
    def learning_rate(self) -> float:
        """The learning rate the next step applies (the rule's ``lr``)."""
        return self._rule.lr

    def set_learning_rate(self, lr: float) -> None:
        """From the next step on, update as an optimizer built with ``rule`` of learning
        rate ``lr`` (``dataclasses.replace(rule, lr=lr)``) would, bit for bit; the rule's
        states, the step count and the master copies are kept. What a training loop calls
        before each step to follow a schedule (``fpsim.optim.schedules``). ``lr``: a finite
        number >= 0 (0, where a schedule reaches it, as torch allows: the states still
        advance and the weights stay; the rules refuse 0 as the lr they are built with)."""
        lr = check_between("lr", lr, 0.0)
        if not (dataclasses.is_dataclass(self._rule)
                and "lr" in {f.name for f in dataclasses.fields(self._rule)}):
            raise TypeError(f"set_learning_rate needs a rule with an lr field (SGD, Adam, "
                            f"AdamW or a dataclass like them), got {described(self._rule)}")
        rule = _with_learning_rate(self._rule, lr)
        transforms = list(self.transform.transforms)
        transforms[self._rule_at] = apply_rule(rule, self.master_fmt)
        self.transform = Chain(tuple(transforms))
        self._rule = rule

    @property
    def step_count(self) -> int:
        return self.chain_state[self._rule_at].count

    @property
    def states(self) -> dict:
        """The rule's state of each parameter, by name (a new dict: read it, do not assign)."""
        return {name: state for (name, _), state in
                zip(self.named, self.chain_state[self._rule_at].states)}

    @property
    def masters(self) -> dict:
        """The master copies, by name (empty without a master; a new dict: read it)."""
        if self.master_fmt is None:
            return {}
        return {name: value for (name, _), value in
                zip(self.named, self.chain_state[self._stored_at].values)}

    # --- the step ---------------------------------------------------------------------------
    def step(self, scaler_state=None, *, per_parameter: bool = False) -> StepReport:
        """One step (the chain in the module doc); ``per_parameter`` also counts updates and
        lost ones for each parameter (``StepReport.lost_by_parameter``)."""
        if scaler_state is not None:
            check_instance("scaler_state", scaler_state, ScalerState,
                           "None or a ScalerState (a scaler's init(), then each step's "
                           "report.scaler_state)")
        per_parameter = check_flag("per_parameter", per_parameter)
        tensors = self._tensors
        grads = tuple(_grad_array(p) for p in tensors)
        states = self.chain_state
        written: StoredValues = states[self._stored_at]
        stored = self._stored()
        together = self.together_format(stored)
        if together is None:
            step = StepData(grads, grads, scaler_state, per_parameter=per_parameter)
        else:                           # elementwise from here on: one flat array
            step = StepData((join(grads),), grads, scaler_state, per_parameter=per_parameter)
            stored = (rejoin(stored, written.joined),)
        step, self.chain_state = self.transform.update(step, states,
                                                       Params(tensors, stored, together))
        if not step.skipped:
            kept: StoredValues = self.chain_state[self._stored_at]
            apply_updates(tensors, kept.values, self.master_fmt, flat=kept.flat)
        grad_norm = float("nan") if step.grad_norm is None else float(step.grad_norm)
        return StepReport(self.step_count, step.found_inf, step.skipped,
                          1.0 if scaler_state is None else scaler_state.scale, grad_norm,
                          step.clipped, step.updates, step.lost_updates,
                          step.next_scaler_state, step.lost_by_parameter)

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    def _stored(self) -> tuple:
        return self.transform.transforms[self._stored_at].stored(
            self.chain_state[self._stored_at], self._tensors)

    def together_format(self, stored: "tuple | None" = None) -> "Format | None":
        """The format in which the next step updates all parameters as one flat array
        (``fpsim.optim.flat.together_format``), or None where it goes one by one (always
        with ``extra`` transforms: they see one gradient per parameter)."""
        if self.extra:
            return None
        return together_format(self._rule, self._tensors,
                               self._stored() if stored is None else stored,
                               self.chain_state[self._rule_at].states, self.master_fmt)

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every array the optimizer owns (master copies, rule state) plus the step count."""
        out = {"step_count": scalar(self.step_count, xp.int64)}
        for name, master in self.masters.items():
            out[f"master/{name}"] = master
        for name, state in self.states.items():
            for field, value in state._asdict().items():
                if value is not None:
                    out[f"state/{name}/{field}"] = value
        return out

    def load_state_dict(self, arrays: dict) -> None:
        """Load what ``state_dict`` gave. Every array is checked (names, shapes, float dtypes,
        a non-negative integer step count) before anything changes; ``ValueError`` names the
        first that does not fit."""
        check_instance("arrays", arrays, Mapping, "a dict of name -> array, as state_dict gives")
        expected = self._expected_state()
        unknown = sorted(set(arrays) - set(expected))
        if unknown:
            raise ValueError(f"optimizer state has arrays this optimizer does not have: "
                             f"{unknown[:5]}")
        required = [k for k, (shape, _) in expected.items()
                    if k not in arrays and (k == "step_count" or k.startswith("master/"))]
        if required:
            raise ValueError(f"optimizer state lacks {required[:5]}")
        for key, value in arrays.items():
            shape, kind = expected[key]
            value = xp.asarray(value)
            if value.shape != shape or not isdtype(value.dtype, kind):
                raise ValueError(f"optimizer state {key!r} is {value.dtype}{list(value.shape)}; "
                                 f"expected shape {list(shape)} of kind {kind!r}")
        step_count = int(arrays["step_count"])
        if step_count < 0:
            raise ValueError(f"optimizer step_count must be >= 0, got {step_count}")
        masters, states = [], []
        for name, p in self.named:
            if self.master_fmt is not None:
                masters.append(xp.array(arrays[f"master/{name}"], xp.float32))
            template = self._rule.init(p.data)
            fields = {f: (xp.array(arrays[f"state/{name}/{f}"])
                          if f"state/{name}/{f}" in arrays else None)
                      for f in template._fields}
            states.append(type(template)(**fields))
        chain_state = list(self.chain_state)
        chain_state[self._rule_at] = RuleState(step_count, tuple(states))
        chain_state[self._stored_at] = StoredValues(tuple(masters))
        self.chain_state = tuple(chain_state)

    def _expected_state(self) -> dict:
        """Array name -> (shape, accepted dtype kind, ``fpsim.backend.isdtype``'s names) of
        everything ``state_dict`` may give."""
        expected = {"step_count": ((), "integral")}
        for name, p in self.named:
            _check_format(name, p)
            if self.master_fmt is not None:
                expected[f"master/{name}"] = (tuple(p.shape), "real floating")
            for field in self._rule.init(p.data)._fields:
                expected[f"state/{name}/{field}"] = (tuple(p.shape), "real floating")
        return expected


def _with_learning_rate(rule, lr: float):
    """``rule`` with learning rate ``lr``: ``dataclasses.replace`` (its checks run again); an
    lr of 0, which the rules refuse as the one they are built with, set after the checks."""
    if lr > 0:
        return dataclasses.replace(rule, lr=lr)
    zeroed = dataclasses.replace(rule, lr=1.0)        # the other fields checked as given
    object.__setattr__(zeroed, "lr", 0.0)
    return zeroed


def _check_rule(rule) -> None:
    """An update rule is an object with ``init`` and ``apply`` (``SGD(lr=0.1)``, not ``SGD``
    or ``"sgd"``): caught here, not as a missing attribute in the first step."""
    if isinstance(rule, type) or not all(callable(getattr(rule, method, None))
                                         for method in ("init", "apply")):
        raise TypeError(f"rule must be an update rule such as SGD(lr=0.1) or Adam(lr=1e-3) "
                        f"(an object with init and apply), got {described(rule)}")


def _master_format(master) -> "Format | None":
    """The master copy's format; the error names the argument and says that None (not
    'none') keeps no master copy."""
    if master is None or isinstance(master, Format):
        return master
    check_instance("master", master, str, "a format (a Format or its name) or None for no "
                                          "master copy")
    try:
        return get(master)
    except ValueError as err:
        raise ValueError(f"master: {err}; or None (not {master!r}) for no master copy") \
            from None


def _check_format(name: str, p: Tensor) -> None:
    if not isinstance(p.fmt, Format):
        raise ValueError(f"parameter {name!r} is in {p.fmt}, not a number format; the "
                         f"optimizer simulates formats (use a policy like '32-true')")


def _grad_array(p: Tensor) -> xp.ndarray:
    if p.grad is None:
        return xp.zeros(p.shape, xp.float32)
    grad = p.grad.data if isinstance(p.grad, Tensor) else xp.asarray(p.grad)
    return xp.asarray(grad, xp.float32)


def _named(params) -> list[tuple[str, Tensor]]:
    if hasattr(params, "named_parameters"):
        return list(params.named_parameters())
    wanted = "a Module, a Tensor or an iterable of Tensors or of (name, Tensor) pairs"
    if not isinstance(params, Tensor):
        check_instance("params", params, Iterable, wanted)
        if isinstance(params, (str, bytes, Mapping)):     # iterable, but of names
            raise TypeError(f"params must be {wanted}, got {described(params)}")
    named = []
    for i, item in enumerate(params if isinstance(params, Iterable) else [params]):
        if isinstance(item, tuple) and len(item) != 2:
            raise TypeError(f"params[{i}] must be a Tensor or a (name, Tensor) pair, got "
                            f"{described(item)}")
        name, tensor = item if isinstance(item, tuple) else (str(i), item)
        if not isinstance(tensor, Tensor):
            raise TypeError(f"parameter {name!r} is a {type(tensor).__name__}, not a Tensor")
        named.append((name, tensor))
    return named
