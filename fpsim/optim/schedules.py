"""Learning-rate schedules that give ``torch.optim.lr_scheduler``'s learning rates bit for bit.

A schedule is a frozen, checked config; the learning rates follow from it and the rule's
learning rate (``base_lr``, torch's ``initial_lr``)::

    schedule.lrs(steps, base_lr)   # the lr of steps 0 .. steps-1, Python floats
    schedule.lr_at(step, base_lr)  # the lr of one step (replayed from step 0: cheap)

Step k's lr is what torch's ``param_groups[0]["lr"]`` holds at the (k+1)-th
``optimizer.step()`` of the usual loop (``optimizer.step(); scheduler.step()``): step 0 runs
with the lr the scheduler set when built. A training loop calls
``optimizer.set_learning_rate(lrs[k])`` before step k; a resumed run recomputes ``lrs`` (the
learning rate is in no checkpoint array: it follows from the step count).

torch computes most of these recursively (its "chainable form": each lr from the one
before, ``CosineAnnealingLR`` multiplying the previous lr by a ratio of cosines), which
differs from the closed form in the last bits; each class here repeats torch's own
operations in its order, in Python floats (torch 2.x, ``torch/optim/lr_scheduler.py``).

=============  ================================================  ==========================
head           torch                                             keys (defaults)
=============  ================================================  ==========================
step           ``StepLR``                                        step_size, gamma (0.1)
cosine         ``CosineAnnealingLR``                             t_max, eta_min (0)
linear         ``LinearLR`` (a linear warm-up)                   start_factor (1/3),
                                                                 end_factor (1), total_iters
                                                                 (5)
onecycle       ``OneCycleLR`` (lr only: cycle_momentum=False)    total_steps, max_lr (the
                                                                 rule's lr), pct_start (0.3),
                                                                 anneal_strategy (cos),
                                                                 div_factor (25),
                                                                 final_div_factor (1e4),
                                                                 three_phase (false)
warmup_cosine  ``SequentialLR([LinearLR(start_factor,            warmup, t_max,
               total_iters=warmup), CosineAnnealingLR(t_max,     start_factor (1/3),
               eta_min)], milestones=[warmup])``                 eta_min (0)
=============  ================================================  ==========================

>>> cosine = parse_schedule("cosine:t_max=4")
>>> cosine
Cosine(t_max=4, eta_min=0.0)
>>> cosine.lrs(6, 0.1)
[0.1, 0.08535533905932738, 0.05, 0.014644660940672627, 0.0, 0.014644660940672622]
>>> str(cosine), cosine.record()
('cosine:t_max=4,eta_min=0.0', {'schedule': 'cosine', 't_max': 4, 'eta_min': 0.0})
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from itertools import islice
from typing import ClassVar

from ..grammar import split_options
from ..options import check_between, check_choice, check_count, check_flag, check_instance

__all__ = ["Schedule", "StepLR", "Cosine", "Linear", "OneCycle", "WarmupCosine",
           "SCHEDULES", "parse_schedule", "schedule_from_record"]


class Schedule:
    """What every schedule has: ``lrs``, ``lr_at``, ``record`` and its string (``parse``'s
    input). A subclass gives ``values(base_lr)``, every step's lr in turn."""

    head: ClassVar[str]

    def values(self, base_lr: float):
        raise NotImplementedError

    def lrs(self, steps: int, base_lr: float) -> list:
        """The learning rates of steps 0 .. ``steps`` - 1."""
        steps = check_count("steps", steps)
        return list(islice(self.values(_base(base_lr)), steps))

    def lr_at(self, step: int, base_lr: float) -> float:
        """The learning rate of step ``step`` (0: the first)."""
        step = check_count("step", step)
        return next(islice(self.values(_base(base_lr)), step, None))

    def record(self) -> dict:
        """The schedule as run.json keeps it (``schedule_from_record`` reads it back)."""
        return {"schedule": self.head, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def __str__(self) -> str:
        pairs = ",".join(f"{f.name}={_spelled(getattr(self, f.name))}" for f in fields(self))
        return f"{self.head}:{pairs}"


def _base(base_lr) -> float:
    return check_between("base_lr", base_lr, 0.0, low_open=True)


def _spelled(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) \
        else str(value)


def _set(config, name: str, value) -> None:
    """Store a checked field as it will be used (a frozen dataclass's own fields)."""
    object.__setattr__(config, name, value)


class Chainable(Schedule):
    """A schedule in torch's chainable form: each lr from the one before (``following``),
    starting from ``first``."""

    def first(self, base_lr):
        return base_lr

    def values(self, base_lr):
        return chained(self, self.first(base_lr), base_lr)


def chained(schedule: Chainable, lr: float, base_lr: float):
    """``lr``, then each next lr from the one before by ``schedule.following`` (torch's
    chainable form), without end."""
    epoch = 0
    while True:
        yield lr
        epoch += 1
        lr = schedule.following(lr, base_lr, epoch)


@dataclass(frozen=True)
class StepLR(Chainable):
    """``torch.optim.lr_scheduler.StepLR``: the lr times ``gamma`` every ``step_size``
    steps, multiplied onto the previous lr (not ``base * gamma ** n``)."""

    head: ClassVar[str] = "step"
    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        _set(self, "step_size", check_count("step_size", self.step_size, 1))
        _set(self, "gamma", check_between("gamma", self.gamma, 0.0))

    def following(self, lr, base_lr, epoch):
        return lr * self.gamma if epoch % self.step_size == 0 else lr

    def restarted(self, base_lr):
        return base_lr * self.gamma ** (0 // self.step_size)


@dataclass(frozen=True)
class Cosine(Chainable):
    """``torch.optim.lr_scheduler.CosineAnnealingLR`` in torch's recursive form: each lr is
    the previous one minus ``eta_min`` times a ratio of cosines, plus ``eta_min``; past
    ``t_max`` it climbs back (period ``2 t_max``), as torch's does."""

    head: ClassVar[str] = "cosine"
    t_max: int
    eta_min: float = 0.0

    def __post_init__(self) -> None:
        _set(self, "t_max", check_count("t_max", self.t_max, 1))
        _set(self, "eta_min", check_between("eta_min", self.eta_min, 0.0))

    def following(self, lr, base_lr, epoch):
        t_max, eta_min = self.t_max, self.eta_min
        if (epoch - 1 - t_max) % (2 * t_max) == 0:
            return lr + (base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        return ((1 + math.cos(math.pi * epoch / t_max))
                / (1 + math.cos(math.pi * (epoch - 1) / t_max)) * (lr - eta_min) + eta_min)

    def restarted(self, base_lr):
        return (self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * 0 / self.t_max)) / 2)


@dataclass(frozen=True)
class Linear(Chainable):
    """``torch.optim.lr_scheduler.LinearLR``: from ``start_factor`` times the lr to
    ``end_factor`` times it over ``total_iters`` steps (a linear warm-up), in torch's
    recursive form; then constant."""

    head: ClassVar[str] = "linear"
    start_factor: float = 1.0 / 3
    end_factor: float = 1.0
    total_iters: int = 5

    def __post_init__(self) -> None:
        _set(self, "start_factor", check_between("start_factor", self.start_factor, 0.0, 1.0,
                                                 low_open=True))
        _set(self, "end_factor", check_between("end_factor", self.end_factor, 0.0, 1.0))
        _set(self, "total_iters", check_count("total_iters", self.total_iters, 1))

    def first(self, base_lr):
        return base_lr * self.start_factor

    def following(self, lr, base_lr, epoch):
        if epoch > self.total_iters:
            return lr
        start, end = self.start_factor, self.end_factor
        return lr * (1.0 + (end - start) / (self.total_iters * start + (epoch - 1) * (end - start)))

    def restarted(self, base_lr):
        start, end = self.start_factor, self.end_factor
        return base_lr * (start + (end - start) * min(self.total_iters, 0) / self.total_iters)


@dataclass(frozen=True)
class WarmupCosine(Schedule):
    """A linear warm-up, then cosine annealing: torch's ``SequentialLR`` of
    ``LinearLR(start_factor, 1.0, total_iters=warmup)`` and ``CosineAnnealingLR(t_max,
    eta_min)`` with the milestone ``warmup``. At the milestone torch restarts the cosine from
    its closed form (``eta_min + (base - eta_min) * 2 / 2``); from there it is recursive."""

    head: ClassVar[str] = "warmup_cosine"
    warmup: int
    t_max: int
    start_factor: float = 1.0 / 3
    eta_min: float = 0.0

    def __post_init__(self) -> None:
        _set(self, "warmup", check_count("warmup", self.warmup, 1))
        _set(self, "start_factor", Linear(self.start_factor, 1.0, self.warmup).start_factor)
        cosine = Cosine(self.t_max, self.eta_min)
        _set(self, "t_max", cosine.t_max)
        _set(self, "eta_min", cosine.eta_min)

    def values(self, base_lr):
        warm_up = Linear(self.start_factor, 1.0, self.warmup)
        yield from islice(warm_up.values(base_lr), self.warmup)
        cosine = Cosine(self.t_max, self.eta_min)
        yield from chained(cosine, cosine.restarted(base_lr), base_lr)


@dataclass(frozen=True)
class OneCycle(Schedule):
    """``torch.optim.lr_scheduler.OneCycleLR``'s learning rate (torch computes it in closed
    form; momentum is not cycled, as with ``cycle_momentum=False``): from ``max_lr /
    div_factor`` up to ``max_lr`` over ``pct_start`` of ``total_steps``, then down to
    ``max_lr / div_factor / final_div_factor`` (``three_phase``: back to the start first).
    ``max_lr`` None: the rule's lr. Defined for steps 0 .. ``total_steps``, as torch's."""

    head: ClassVar[str] = "onecycle"
    total_steps: int
    max_lr: float | None = None
    pct_start: float = 0.3
    anneal_strategy: str = "cos"
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    three_phase: bool = False

    def __post_init__(self) -> None:
        _set(self, "total_steps", check_count("total_steps", self.total_steps, 1))
        if self.max_lr is not None:
            _set(self, "max_lr", check_between("max_lr", self.max_lr, 0.0, low_open=True))
        _set(self, "pct_start", check_between("pct_start", self.pct_start, 0.0, 1.0))
        check_choice("anneal_strategy", self.anneal_strategy, ("cos", "linear"))
        _set(self, "div_factor", check_between("div_factor", self.div_factor, 0.0,
                                               low_open=True))
        _set(self, "final_div_factor", check_between("final_div_factor",
                                                     self.final_div_factor, 0.0, low_open=True))
        _set(self, "three_phase", check_flag("three_phase", self.three_phase))
        start = 0.0
        for number, (end, _, _) in enumerate(self.phases(), 1):
            if end - start == 0:
                raise ValueError(f"onecycle: pct_start={self.pct_start} with total_steps="
                                 f"{self.total_steps} makes phase {number} of the cycle zero "
                                 f"steps long (torch would divide by zero there); change "
                                 f"pct_start or total_steps")
            start = end

    def phases(self) -> list:
        """(end_step, start lr's name, end lr's name) of each phase, as torch's."""
        up = float(self.pct_start * self.total_steps) - 1
        last = self.total_steps - 1
        if self.three_phase:
            return [(up, "initial", "max"), (float(2 * self.pct_start * self.total_steps) - 2,
                                             "max", "initial"), (last, "initial", "min")]
        return [(up, "initial", "max"), (last, "max", "min")]

    def values(self, base_lr):
        peak = base_lr if self.max_lr is None else self.max_lr
        initial = peak / self.div_factor
        ends = {"initial": initial, "max": peak, "min": initial / self.final_div_factor}
        phases = self.phases()
        for step in range(self.total_steps + 1):
            start_step = 0.0
            for i, (end_step, start_lr, end_lr) in enumerate(phases):
                if step <= end_step or i == len(phases) - 1:
                    pct = (step - start_step) / (end_step - start_step)
                    yield self.anneal(ends[start_lr], ends[end_lr], pct)
                    break
                start_step = end_step
        raise ValueError(f"onecycle: total_steps={self.total_steps} gives learning rates for "
                         f"steps 0 to {self.total_steps} only (torch refuses to step further)")

    def anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            cos_out = math.cos(math.pi * pct) + 1
            return end + (start - end) / 2.0 * cos_out
        return (end - start) * pct + start


SCHEDULES = {kind.head: kind for kind in (StepLR, Cosine, Linear, OneCycle, WarmupCosine)}


def parse_schedule(text: str) -> Schedule:
    """A schedule from its string, ``head:key=value,...`` (the table in the module doc;
    ``str(schedule)`` gives it back): numbers as Python reads them, ``true``/``false``,
    ``none`` for max_lr. Every mistake is one ValueError naming the text and the key.

    >>> parse_schedule("step:step_size=30,gamma=0.5")
    StepLR(step_size=30, gamma=0.5)
    >>> parse_schedule("cosine:tmax=100")
    Traceback (most recent call last):
    ValueError: schedule 'cosine:tmax=100': unknown cosine key 'tmax'; did you mean 't_max'?
    accepted: t_max, eta_min
    """
    check_instance("schedule", text, str, "a string such as 'cosine:t_max=100'")
    head, pairs = split_options(text, "schedule")        # fpsim.grammar, as every option
    try:
        kind = SCHEDULES[check_choice("schedule", head, tuple(SCHEDULES))]
        arguments = _arguments(kind, pairs)
        return kind(**arguments)
    except (TypeError, ValueError) as err:
        raise ValueError(f"schedule {text!r}: {err}") from None


def _arguments(kind, pairs: dict) -> dict:
    """The ``key=value`` pairs as the keyword arguments of ``kind``, each converted to its
    field's type; the required fields present."""
    types = {f.name: f.type for f in fields(kind)}
    arguments = {}
    for key, value in pairs.items():
        check_choice(f"{kind.head} key", key, tuple(types))
        arguments[key] = _converted(key, value, types[key])
    missing = [f.name for f in fields(kind) if f.default is MISSING and f.name not in arguments]
    if missing:
        raise ValueError(f"{kind.head} needs {', '.join(missing)} ({kind.head}:"
                         f"{','.join(f'{m}=...' for m in missing)})")
    return arguments


def _converted(key: str, value: str, kind: str):
    """``value`` (text) as a field of type ``kind`` (its annotation) takes it."""
    if kind == "str":
        return value
    if kind == "bool":
        return check_choice(f"{key} value", value.lower(), ("true", "false")) == "true"
    if kind.endswith("| None") and value.lower() == "none":
        return None
    try:
        return int(value) if kind == "int" else float(value)
    except ValueError:
        wanted = "an integer" if kind == "int" else "a number"
        raise ValueError(f"{key} must be {wanted}, got {value!r}") from None


def schedule_from_record(record) -> Schedule:
    """The schedule a ``record()`` describes (as run.json reads back), through the same
    checks; a ValueError names what does not fit."""
    check_instance("schedule record", record, dict, "a dict such as Schedule.record() gives")
    head = record.get("schedule")
    kind = SCHEDULES[check_choice("schedule", head, tuple(SCHEDULES))]
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(record) - names - {"schedule"})
    if unknown:
        raise ValueError(f"schedule record of {head} has unknown keys {unknown}; accepted: "
                         f"{', '.join(sorted(names))}")
    return kind(**{k: v for k, v in record.items() if k != "schedule"})
