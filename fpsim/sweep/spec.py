"""Sweep specifications: a TOML file read with ``tomllib`` and checked whole before anything
runs.

    [sweep]                      # optional: a name and a description
    name = "loss scale"

    [base]                       # fields of `fpsim train` (its long options, - or _)
    data = "blobs"
    steps = 60

    [grid]                       # every combination of these lists
    policy = ["16-mixed", "bf16-mixed"]
    seed = [0, 1, 2]

    [zip]                        # lists of one length, varied together (one more axis)
    lr = [0.1, 0.01]
    momentum = [0.0, 0.9]

A field is any option of ``fpsim train`` except those the sweep owns (``out``, ``resume``,
``checkpoint-every``, ``trace-format``, ``quiet``, ``overwrite``, ``allow-change``, ``plot``); its default is ``fpsim train``'s. Each value
is checked for its type and, where the field names something (policy, scaler, optimizer, data
set, activation, master format, hidden sizes), that the name is known. A problem raises
``SpecError`` (a ``ValueError``) naming the file, the table, the field and what is accepted.
Combinations that only fail together (Adam with a momentum) are not errors here: such a cell
is run, fails, and is recorded as failed.
"""
from __future__ import annotations

import argparse
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .. import formats, nn
from ..options import check_instance, check_path
from ..autograd import get_policy
from ..train import DATASETS, LOSSES, resolve_scaler
from ..train.factories import MODELS, is_factory, parse_arguments
from ..train import cli as train_cli


__all__ = ["SweepSpec", "SpecError", "load_spec", "parse_spec", "train_fields", "SWEEP_OWNED"]

SWEEP_OWNED = ("out", "resume", "checkpoint_every", "trace_format", "quiet", "overwrite",
               "allow_change", "plot", "backend")
TABLES = ("sweep", "base", "grid", "zip")
SWEEP_KEYS = ("name", "description")


class SpecError(ValueError):
    """A sweep specification that cannot run: one line naming what is wrong."""


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep: ``base`` holds every training field (defaults filled in), ``grid``
    the axes crossed with each other, ``zipped`` the axes varied together."""

    name: str
    description: str
    base: dict
    grid: dict = field(default_factory=dict)
    zipped: dict = field(default_factory=dict)
    source: str = "<spec>"

    @property
    def axes(self) -> list[str]:
        return [*self.grid, *self.zipped]

    def as_dict(self) -> dict:
        """The normalized specification (what ``sweep.json`` stores and compares)."""
        return {"name": self.name, "description": self.description, "base": self.base,
                "grid": self.grid, "zip": self.zipped}


def _train_parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    train_cli.register(commands)
    return commands.choices["train"]


def train_fields() -> dict[str, argparse.Action]:
    """``fpsim train``'s options by field name (underscores), read from its own parser, so a
    sweep accepts exactly what ``fpsim train`` accepts, with the same defaults."""
    return {action.dest: action for action in _train_parser()._actions
            if action.dest not in ("help", *SWEEP_OWNED)}


def train_defaults() -> argparse.Namespace:
    """What ``fpsim train`` parses from no options: every option at its default, the ones
    the sweep owns included, so a cell's arguments are complete whatever train adds."""
    return _train_parser().parse_args([])


def load_spec(path: "str | Path") -> SweepSpec:
    """Read and check a sweep file."""
    path = check_path("path", path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"sweep file {path} not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"cannot read sweep file {path}: {err}") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, source: str = "<spec>") -> SweepSpec:
    check_instance("text", text, str, "the sweep's TOML as a str (load_spec reads a file; "
                                      "bytes.decode() gives a str)")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{source}: not valid TOML: {err}") from None
    unknown = [key for key in raw if key not in TABLES]
    if unknown:
        raise SpecError(f"{source}: unknown table or key {unknown[0]!r}; a sweep has the "
                        f"tables {', '.join(f'[{t}]' for t in TABLES)}")
    for table in TABLES:
        if table in raw and not isinstance(raw[table], dict):
            raise SpecError(f"{source}: {table!r} must be a table ([{table}])")
    meta = raw.get("sweep", {})
    for key, value in meta.items():
        if key not in SWEEP_KEYS:
            raise SpecError(f"{source}: [sweep] has no field {key!r}; accepted: "
                            f"{', '.join(SWEEP_KEYS)}")
        if not isinstance(value, str):
            raise SpecError(f"{source}: [sweep] {key} must be a string, got {value!r}")
    fields = train_fields()
    seen: dict[str, str] = {}
    tables = {}
    for table in ("base", "grid", "zip"):
        checked = {}
        for key, value in raw.get(table, {}).items():
            name = _field_name(key, fields, source, table)
            if name in seen:
                raise SpecError(f"{source}: field {key!r} is in both [{seen[name]}] and "
                                f"[{table}]; give it in one place")
            seen[name] = table
            where = f"{source}: [{table}] {key}"
            if table == "base":
                checked[name] = check_value(name, value, fields[name], where)
            else:
                checked[name] = _check_axis(name, value, fields[name], where)
        tables[table] = checked
    lengths = {name: len(values) for name, values in tables["zip"].items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise SpecError(f"{source}: the lists in [zip] must have one length ({listed})")
    if not tables["grid"] and not tables["zip"]:
        raise SpecError(f"{source}: nothing to vary: give at least one list in [grid] or [zip]")
    base = {name: action.default for name, action in fields.items()}
    base.update(tables["base"])
    for name in (*tables["grid"], *tables["zip"]):
        base.pop(name)
    return SweepSpec(meta.get("name", Path(source).stem), meta.get("description", ""), base,
                     tables["grid"], tables["zip"], source)


def _field_name(key: str, fields: dict, source: str, table: str) -> str:
    name = key.replace("-", "_")
    if name in fields:
        return name
    if name in SWEEP_OWNED:
        raise SpecError(f"{source}: [{table}] {key!r} is set by the sweep itself, not by the "
                        f"spec; fields: {', '.join(f.replace('_', '-') for f in fields)}")
    raise SpecError(f"{source}: [{table}] has unknown field {key!r}; fields (those of fpsim "
                    f"train): {', '.join(f.replace('_', '-') for f in fields)}")


def _check_axis(name: str, values, action, where: str) -> list:
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: an axis is a non-empty list of values, got {values!r}")
    checked = [check_value(name, value, action, where) for value in values]
    for i, value in enumerate(checked):
        if value in checked[:i]:
            raise SpecError(f"{where}: {values[i]!r} is listed twice")
    return checked


_SIZES = re.compile(r"^\s*([1-9][0-9]*\s*(,\s*[1-9][0-9]*\s*)*)?$")  # "" = no hidden layer


def check_value(name: str, value, action, where: str):
    """``value`` as the training field ``name`` takes it (an ``int``, a ``float`` or a
    string), or ``SpecError``."""
    kind = action.type or (bool if isinstance(action.default, bool) else str)
    if isinstance(action.default, list):      # a repeatable option: --model-arg K=V ...
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SpecError(f"{where}: must be a list of strings like [\"width=8\"], got "
                            f"{value!r}")
        try:
            parse_arguments(value, f"--{name.replace('_', '-')}")
        except ValueError as err:
            raise SpecError(f"{where}: {err}") from None
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{where}: must be an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{where}: must be a number, got {value!r}")
        value = float(value)
    elif kind is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{where}: must be true or false, got {value!r}")
    elif not isinstance(value, str):
        raise SpecError(f"{where}: must be a string, got {value!r}")
    if action.choices is not None and value not in action.choices:
        raise SpecError(f"{where}: {value!r} is not accepted; choose "
                        f"{', '.join(map(str, action.choices))}")
    problem = _check_meaning(name, value)
    if problem:
        raise SpecError(f"{where}: {problem}")
    return value


_AT_LEAST = {"steps": 1, "batch_size": 1, "samples": 1, "features": 1, "classes": 2, "seed": 0}
_NON_NEGATIVE = ("momentum", "weight_decay")
_POSITIVE = ("lr", "clip_norm")


def _check_meaning(name: str, value) -> str | None:
    """What is wrong with one value of a field on its own, or None."""
    if name in _AT_LEAST and value < _AT_LEAST[name]:
        return f"must be >= {_AT_LEAST[name]}, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, got {value!r}"
    if name in _POSITIVE and value <= 0:
        return f"must be > 0, got {value!r}"
    if name in _NON_NEGATIVE and value < 0:
        return f"must be >= 0, got {value!r}"
    try:
        if name == "policy":
            get_policy(value)
        elif name == "scaler":
            resolve_scaler(value)
        elif name == "optimizer" and value not in train_cli.OPTIMIZERS:
            return f"unknown optimizer {value!r}; choose {', '.join(train_cli.OPTIMIZERS)}"
        elif name == "data" and value not in DATASETS and not is_factory(value):
            return (f"unknown data set {value!r}; choose {', '.join(DATASETS)}, or "
                    f"MODULE:FACTORY")
        elif name == "model" and value not in MODELS and not is_factory(value):
            return f"unknown model {value!r}; choose {', '.join(MODELS)}, or MODULE:FACTORY"
        elif name == "loss" and value not in LOSSES:
            return f"unknown loss {value!r}; choose {', '.join(LOSSES)}"
        elif name == "activation" and value not in nn.ACTIVATIONS:
            return f"unknown activation {value!r}; choose {', '.join(nn.ACTIVATIONS)}"
        elif name == "master" and value.lower() != "none":
            formats.get(value)
        elif name == "hidden" and not _SIZES.match(value):
            return f"hidden sizes are comma-separated positive integers like '64,64', got {value!r}"
    except (ValueError, TypeError) as err:
        return str(err)
    return None
