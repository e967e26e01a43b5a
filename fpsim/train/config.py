"""``TrainConfig``: everything a run of ``fpsim train`` is, in one frozen dataclass checked
once, when it is built.

One schema serves every way a run is described: ``fpsim train``'s options are generated from
the fields (``OPTIONS``: flag, help, how a command line writes the value), a sweep spec's
fields are these same options (``from_options``), and ``run.json`` records the configuration
(``record``; ``TrainConfig.from_run`` reads a run's configuration back through the same
checks). Each field has one check (``check_field``), which ``TrainConfig``, the sweep
spec and ``train(model, data, ...)``'s keyword arguments all use; a value is refused with one
sentence naming the field, its flag, what it got and what is accepted (``TypeError`` for the
wrong type, ``ValueError`` for a value out of range).

>>> config = TrainConfig(policy="16-true", steps=10, hidden="32,32")
>>> config.hidden, config.master
((32, 32), None)
>>> TrainConfig(lr=-1.0)
Traceback (most recent call last):
ValueError: lr (--lr) must be a number in (0.0, inf), got -1.0
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .. import formats, nn
from ..autograd import get_policy
from ..options import (check_choice, check_count, check_flag, check_float32, check_instance,
                       check_path)
from ..optim.schedules import parse_schedule
from ..scaling import get_scaler
from .data import DATASETS
from .factories import MODELS, is_factory, parse_arguments
from .losses import LOSSES
from .resume import ADJUSTABLE_ON_RESUME, check_allowed_changes
from .trace import strict_json

__all__ = ["TrainConfig", "Option", "OPTIONS", "OPTIMIZERS", "check_field", "from_options",
           "RUN_OPTIONS", "OUTPUT_OPTIONS"]

OPTIMIZERS = ("sgd", "adam", "adamw")


class Option(NamedTuple):
    """How the field ``name`` appears on ``fpsim train``'s command line and in a sweep spec:
    ``flag`` (without ``--``), ``kind`` (``str``, ``int``, ``float``, ``bool`` for a switch,
    ``list`` for a repeatable ``KEY=VALUE``), its help text and ``metavar``."""

    name: str
    flag: str
    kind: type
    help: str
    metavar: str | None = None


def _option(flag: str, kind: type, help_text: str, metavar: str | None = None) -> dict:
    return {"cli": (flag, kind, help_text, metavar)}


@dataclass(frozen=True)
class TrainConfig:
    """A training run as ``fpsim train`` and sweeps describe it (see the module docstring).
    ``model``/``data``: a built-in name or ``MODULE:FACTORY``; ``model_args``/``data_args``:
    the factory's keyword arguments; ``samples``, ``features``, ``classes``: the built-in data
    sets' sizes; ``hidden``, ``activation``: the built-in mlp's (and cnn's activation)."""

    model: str = field(default="mlp", metadata=_option(
        "model", str, f"model: {', '.join(MODELS)} (sized from the data), or MODULE:FACTORY, "
        f"a function returning an fpsim.nn.Module (MODULE is imported from the current folder "
        f"first, as python -m does)"))
    model_args: dict = field(default_factory=dict, metadata=_option(
        "model-arg", list, "keyword argument for the model's factory (repeatable; VALUE read "
        "as JSON where it is: 8, 0.5, [8, 16], else as text)", "KEY=VALUE"))
    data: str = field(default="teacher", metadata=_option(
        "data", str, f"data set: {', '.join(DATASETS)}, or MODULE:FACTORY, a function "
        f"returning an fpsim.train.Dataset"))
    data_args: dict = field(default_factory=dict, metadata=_option(
        "data-arg", list, "keyword argument for the data set (images: size, channels, noise; "
        "tokens: length; a factory: its own)", "KEY=VALUE"))
    loss: str = field(default="auto", metadata=_option(
        "loss", str, f"{', '.join(LOSSES)} (auto: cross_entropy for labels, mse for "
        f"regression targets), or MODULE:FUNCTION, a function loss(output, targets)"))
    samples: int = field(default=2048, metadata=_option(
        "samples", int, "samples of a built-in data set"))
    features: int = field(default=16, metadata=_option(
        "features", int, "input features of a built-in data set"))
    classes: int = field(default=4, metadata=_option(
        "classes", int, "classes of a built-in data set"))
    hidden: tuple = field(default=(64, 64), metadata=_option(
        "hidden", str, "hidden layer sizes of the built-in mlp, comma-separated ('' for none)"))
    activation: str = field(default="relu", metadata=_option(
        "activation", str, f"activation of the built-in mlp and cnn: "
        f"{', '.join(nn.ACTIVATIONS)}"))
    policy: str = field(default="16-mixed", metadata=_option(
        "policy", str, "precision recipe: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, "
        "64-true; an FP8/FP4 recipe: fp8-current, fp8-delayed, mxfp8, fp8-block, nvfp4, mxfp4, "
        "mxfp6 (NAME:key=value,...; keep=NAME holds a layer in bf16); or jmp style "
        "params=...,compute=...,output=..."))
    optimizer: str = field(default="sgd", metadata=_option(
        "optimizer", str, ", ".join(OPTIMIZERS)))
    lr: float = field(default=0.1, metadata=_option("lr", float, "learning rate"))
    momentum: float = field(default=0.0, metadata=_option("momentum", float, "SGD momentum"))
    weight_decay: float = field(default=0.0, metadata=_option(
        "weight-decay", float, "weight decay"))
    master: str | None = field(default=None, metadata=_option(
        "master", str, "master-weight format (fp32, ...), or 'none' to update the weights "
        "directly (default: the recipe's: fp32 for 16-mixed and bf16-mixed, none otherwise)"))
    clip_norm: float | None = field(default=None, metadata=_option(
        "clip-norm", float, "clip the global gradient norm to this value (default: none)"))
    scaler: str | None = field(default=None, metadata=_option(
        "scaler", str, "none, dynamic (torch's GradScaler), static:N, or a preset: torch, "
        "apex, deepspeed, deepspeed-fp16, megatron, tf-keras, keras3, jmp, with optional "
        "overrides NAME:key=value,... (default: the recipe's: dynamic for 16-mixed, none "
        "otherwise)"))
    schedule: str | None = field(default=None, metadata=_option(
        "schedule", str, "learning-rate schedule, torch's bit for bit: step:step_size=N,"
        "gamma=G; cosine:t_max=N,eta_min=E; linear:start_factor=F,total_iters=N; "
        "onecycle:total_steps=N,max_lr=L; warmup_cosine:warmup=W,t_max=N "
        "(fpsim.optim.schedules; default: the constant --lr); the trace records each step's lr"))
    accumulate: int = field(default=1, metadata=_option(
        "accumulate", int, "micro-batches of --batch-size whose gradients add up before each "
        "optimizer step (each micro-batch's loss divided by this, as in torch)"))
    steps: int = field(default=200, metadata=_option("steps", int, "optimizer steps"))
    batch_size: int = field(default=64, metadata=_option(
        "batch-size", int, "samples per (micro-)batch, drawn with replacement; at most the "
        "data's sample count"))
    seed: int = field(default=0, metadata=_option(
        "seed", int, "seed for data, weights and batches"))
    per_layer: bool = field(default=False, metadata=_option(
        "per-layer", bool, "also record, per parameter and step, the fraction of its gradient "
        "values that underflowed, of its updates lost, and its largest gradient magnitude: "
        "OUT/layers.jsonl (fpsim plot --per-layer draws them)"))
    out: Path | None = field(default=None, metadata=_option(
        "out", str, "folder for run.json, the trace and checkpoint.npz (default: write "
        "nothing)"))
    trace_format: str = field(default="jsonl", metadata=_option(
        "trace-format", str, "trace file layout: jsonl or csv"))
    checkpoint_every: int | None = field(default=None, metadata=_option(
        "checkpoint-every", int, "steps between checkpoints (default: one at the end)"))
    resume: Path | None = field(default=None, metadata=_option(
        "resume", str, "checkpoint.npz to continue from (default: none, a new run)"))
    overwrite: bool = field(default=False, metadata=_option(
        "overwrite", bool, "replace the run that --out already holds (refused without this)"))
    allow_changes: tuple = field(default=(), metadata=_option(
        "allow-change", list, f"let a resumed run change this setting "
        f"({', '.join(ADJUSTABLE_ON_RESUME)}; repeatable); any other difference from the "
        f"checkpoint is refused", "FIELD"))

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            object.__setattr__(self, item.name, check_field(item.name, getattr(self, item.name)))
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(f"momentum (--momentum) is an SGD option; {self.optimizer} has "
                             f"beta1, got momentum {self.momentum}")
        if self.allow_changes and self.resume is None:
            raise ValueError("allow_changes (--allow-change) applies to a resumed run: give "
                             "resume (--resume CHECKPOINT) too")

    def replace(self, **changes) -> "TrainConfig":
        """A copy with some fields changed, checked again."""
        return dataclasses.replace(self, **changes)

    def uses(self, name: str) -> bool:
        """Whether field ``name`` reaches the run: the built-in data sets' sizes only with a
        built-in data set, ``hidden`` only with the built-in mlp, ``activation`` with the
        mlp and cnn, a factory's arguments only with a factory."""
        built_in_data = not is_factory(self.data)
        return {"samples": built_in_data, "features": built_in_data, "classes": built_in_data,
                "hidden": self.model == "mlp", "activation": self.model in ("mlp", "cnn"),
                "momentum": self.optimizer == "sgd"}.get(name, True)

    def options(self) -> dict:
        """The run fields (outputs aside) as JSON values keyed by flag: what ``run.json``
        keeps as ``train_config`` and ``from_options`` reads back through the same checks."""
        values = {}
        for name in RUN_OPTIONS:
            value = getattr(self, name)
            values[OPTIONS[name].flag.replace("-", "_")] = (
                ",".join(map(str, value)) if name == "hidden" else
                dict(value) if isinstance(value, dict) else value)
        return values

    @classmethod
    def from_run(cls, path) -> "TrainConfig":
        """The configuration of the run in folder ``path`` (its ``run.json``'s
        ``train_config``), checked as any; outputs are not taken (give ``out=`` with
        ``replace``)."""
        folder = check_path("path", path)
        record = folder / "run.json" if folder.is_dir() else folder
        try:
            info = strict_json(record.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ValueError(f"cannot read the run's configuration from {record}: "
                             f"{type(err).__name__}: {err}") from None
        options = info.get("config", {}).get("train_config") if isinstance(info, dict) and \
            isinstance(info.get("config"), dict) else None
        if not isinstance(options, dict):
            raise ValueError(f"{record} holds no train_config (runs of fpsim train and "
                             f"train(config) from fpsim 0.2 on record it)")
        try:
            return from_options(options)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{record}: train_config: {err}") from None

    def record(self) -> dict:
        """The fields that describe the run (outputs aside) as JSON values, as ``run.json``'s
        ``config`` holds them (its ``model_spec``, ``data_spec``, ``model_args`` ...)."""
        recorded = {"command": "train", "model_spec": self.model, "data_spec": self.data,
                    "model_args": dict(self.model_args), "data_args": dict(self.data_args),
                    "train_config": self.options()}
        for name in ("samples", "features", "classes", "activation"):
            if self.uses(name):
                recorded[name] = getattr(self, name)
        if self.uses("hidden"):
            recorded["hidden"] = ",".join(map(str, self.hidden))
        return recorded


OPTIONS = {item.name: Option(item.name, *item.metadata["cli"])
           for item in dataclasses.fields(TrainConfig)}
# the fields that say where and how a run's files are written, apart from what it computes
OUTPUT_OPTIONS = ("out", "trace_format", "checkpoint_every", "resume", "overwrite",
                  "allow_changes")
RUN_OPTIONS = tuple(name for name in OPTIONS if name not in OUTPUT_OPTIONS)


def from_options(values: dict) -> TrainConfig:
    """A ``TrainConfig`` from option values keyed by flag (``model_arg``, ``batch_size``...,
    ``-`` or ``_``) as a command line or a sweep spec gives them: ``model_arg`` a list of
    ``KEY=VALUE`` strings, ``hidden`` ``"64,64"``; absent options take their defaults."""
    by_flag = {option.flag.replace("-", "_"): option.name for option in OPTIONS.values()}
    fields = {}
    for key, value in values.items():
        name = by_flag.get(str(key).replace("-", "_"))
        if name is None:
            raise ValueError(f"unknown training option {key!r}; options: "
                             f"{', '.join(o.flag for o in OPTIONS.values())}")
        fields[name] = value
    return TrainConfig(**fields)


def _described(name: str) -> str:
    return f"{name} (--{OPTIONS[name].flag})"


def _text(name: str, value) -> str:
    return check_instance(_described(name), value, str, "a string")


def _spec(name: str, value, built_in: tuple) -> str:
    """A built-in name or ``MODULE:FACTORY``."""
    text = _text(name, value).strip()
    if text not in built_in and not is_factory(text):
        raise ValueError(f"unknown {name} {text!r} for --{OPTIONS[name].flag}; choose "
                         f"{', '.join(built_in)}, or MODULE:FACTORY")
    return text


def _arguments(name: str, value) -> dict:
    if isinstance(value, dict):
        bad = [key for key in value if not (isinstance(key, str) and key.isidentifier())]
        if bad:
            raise ValueError(f"{_described(name)}: keys must be Python names, got {bad[0]!r}")
        return dict(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return parse_arguments(value, f"--{OPTIONS[name].flag}")
    raise TypeError(f"{_described(name)} must be a dict of keyword arguments or a list of "
                    f"'KEY=VALUE' strings, got {type(value).__name__} {value!r}")


def _hidden(value) -> tuple:
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")] if value.strip() else []
        if not all(part.isdecimal() and int(part) >= 1 for part in parts):
            raise ValueError(f"hidden (--hidden) takes comma-separated positive integers like "
                             f"64,64 (or '' for no hidden layer), got {value!r}")
        return tuple(int(part) for part in parts)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"hidden (--hidden) must be sizes like (64, 64) or '64,64', got "
                        f"{type(value).__name__} {value!r}")
    return tuple(check_count("hidden (--hidden) sizes", size, 1) for size in value)


def _policy(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _text("policy", value).strip()
    get_policy(text)                    # parsed once more when the run starts: same result
    return text


def _master(value) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None if value is None else "none"
    return formats.get(_text("master", value).strip()).name


def _scaler(value) -> str | None:
    if value is None:
        return None
    get_scaler(_text("scaler", value))
    return value.strip()


def _schedule(value) -> str | None:
    if value is None:
        return None
    return str(parse_schedule(_text("schedule", value)))


def _positive(name: str, value) -> float:
    """A hyperparameter > 0 that float32 keeps > 0 (the updates compute in float32)."""
    return check_float32(_described(name), value, 0.0, low_open=True)


def _optional(check):
    return lambda name, value: None if value is None else check(name, value)


_CHECKS = {
    "model": lambda name, v: _spec(name, v, MODELS),
    "data": lambda name, v: _spec(name, v, tuple(DATASETS)),
    "loss": lambda name, v: _spec(name, v, LOSSES),
    "model_args": _arguments,
    "data_args": _arguments,
    "samples": lambda name, v: check_count(_described(name), v, 1),
    "features": lambda name, v: check_count(_described(name), v, 1),
    "classes": lambda name, v: check_count(_described(name), v, 2),
    "hidden": lambda name, v: _hidden(v),
    "activation": lambda name, v: check_choice("activation (--activation)", v,
                                               tuple(nn.ACTIVATIONS)),
    "policy": lambda name, v: _policy(v),
    "optimizer": lambda name, v: check_choice("optimizer (--optimizer)", v, OPTIMIZERS),
    "lr": _positive,
    "momentum": lambda name, v: check_float32(_described(name), v, 0.0),
    "weight_decay": lambda name, v: check_float32(_described(name), v, 0.0),
    "master": lambda name, v: _master(v),
    "clip_norm": _optional(_positive),
    "scaler": lambda name, v: _scaler(v),
    "schedule": lambda name, v: _schedule(v),
    "accumulate": lambda name, v: check_count(_described(name), v, 1),
    "steps": lambda name, v: check_count(_described(name), v, 1),
    "batch_size": lambda name, v: check_count(_described(name), v, 1),
    "seed": lambda name, v: check_count(_described(name), v, 0),
    "per_layer": lambda name, v: check_flag(_described(name), v),
    "out": _optional(lambda name, v: check_path(_described(name), v)),
    "trace_format": lambda name, v: check_choice("trace format (--trace-format)", v,
                                                 ("jsonl", "csv")),
    "checkpoint_every": _optional(lambda name, v: check_count(_described(name), v, 1)),
    "resume": _optional(lambda name, v: check_path(_described(name), v)),
    "overwrite": lambda name, v: check_flag(_described(name), v),
    "allow_changes": lambda name, v: tuple(sorted(check_allowed_changes(v))),
}


def check_field(name: str, value):
    """``value`` as field ``name`` of ``TrainConfig`` holds it (``"64,64"`` becomes
    ``(64, 64)``), or the field's ``TypeError``/``ValueError``."""
    check = _CHECKS.get(name)
    if check is None:
        raise ValueError(f"unknown training option {name!r}; options: {', '.join(OPTIONS)}")
    return check(name, value)

