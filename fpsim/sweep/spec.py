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
``checkpoint-every``, ``trace-format``, ``quiet``, ``overwrite``, ``allow-change``, ``plot``);
its default is ``fpsim train``'s. Each value is checked for its type and by the
``TrainConfig`` field's own check (``fpsim.train.config.check_field``), as ``fpsim train``
checks it. A problem raises
``SpecError`` (a ``ValueError``) naming the file, the table, the field and what is accepted.
Combinations that only fail together (Adam with a momentum) are not errors here: such a cell
is run, fails, and is recorded as failed.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..options import check_instance, check_path
from ..train.config import OPTIONS, RUN_OPTIONS, Option, TrainConfig, check_field


__all__ = ["SweepSpec", "SpecError", "load_spec", "parse_spec", "train_fields", "SWEEP_OWNED"]

SWEEP_OWNED = ("out", "resume", "checkpoint_every", "trace_format", "quiet", "overwrite",
               "allow_change", "plot", "backend")       # fpsim train's options a spec cannot set
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


def train_fields() -> dict[str, Option]:
    """``fpsim train``'s options a spec may set, by flag with underscores (``batch_size``,
    ``model_arg``): ``TrainConfig``'s fields, so a sweep accepts exactly what ``fpsim train``
    accepts, with the same defaults and checks."""
    return {OPTIONS[name].flag.replace("-", "_"): OPTIONS[name] for name in RUN_OPTIONS}


def default_value(option: Option):
    """A field's default as a spec writes it (``hidden = "64,64"``, ``model_arg = []``)."""
    value = getattr(TrainConfig(), option.name)
    if option.kind is list:
        return []
    return ",".join(map(str, value)) if option.name == "hidden" else value


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
    base = {name: default_value(option) for name, option in fields.items()}
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


def check_value(name: str, value, option: Option, where: str):
    """``value`` as the training field ``name`` takes it (an ``int``, a ``float``, a string, a
    list of ``KEY=VALUE`` strings), checked by ``TrainConfig``'s own check, or ``SpecError``."""
    kind = option.kind
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SpecError(f"{where}: must be a list of strings like [\"width=8\"], got "
                            f"{value!r}")
    elif kind is int:
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
    try:
        check_field(option.name, value)
    except (ValueError, TypeError) as err:
        raise SpecError(f"{where}: {err}") from None
    return value
