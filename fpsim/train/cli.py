"""``fpsim train``: a model (built-in or yours) on data (built-in or yours), every step
traced. Its options are ``TrainConfig``'s fields (``fpsim.train.config.OPTIONS``), so the
command line, sweep specs and ``train(config)`` share one schema and one set of checks; bad
input is reported in one line before training starts, with exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

import numpy as np

from .. import backend
from .config import OPTIONS, TrainConfig
from .training import resolve, train
from .recipes import recipe_record, scaler_name

__all__ = ["register", "run", "add_backend_option", "chosen_backend", "add_config_options"]

DESCRIPTION = """\
Train a model on data, every step traced and bit-exact, for example:

  fpsim train --data teacher --hidden 64,64 --policy 16-true --steps 500 --out runs/half
  fpsim train --model mymodels:small_cnn --data mydata:digits --policy bf16-mixed --out runs/b

--model and --data take a built-in name or MODULE:FACTORY, a function of yours (MODULE is
imported from the current folder first, as python -m does). The precision string sets the
recipe as Lightning does: master copy and loss scaler follow from it (16-mixed: fp32 master,
torch's dynamic scaler; bf16-mixed: fp32 master, no scaler; 32-true, 16-true, bf16-true: no
master copy, no scaler); --master and --scaler override them, and run.json and the summary
line say so. Without --out nothing is written. Bad input is reported in one line before
training starts, with exit status 2."""


def register(commands) -> None:
    p = commands.add_parser("train", help="train a model (built-in or yours) and write a "
                            "per-step trace", description=DESCRIPTION)
    add_config_options(p)
    p.add_argument("--plot", action="store_true",
                   help="also draw the run (fpsim plot) into OUT/trace.png at the end; needs "
                        "--out")
    add_backend_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")


def add_config_options(parser) -> None:
    """One option per ``TrainConfig`` field, generated from ``OPTIONS``: values are checked by
    the config, not by argparse, so the messages are the config's (and a sweep's)."""
    defaults = TrainConfig()
    for option in OPTIONS.values():
        flag = f"--{option.flag}"
        if option.kind is bool:
            parser.add_argument(flag, dest=option.name, action="store_true", help=option.help)
        elif option.kind is list:
            parser.add_argument(flag, dest=option.name, action="append", default=[],
                                metavar=option.metavar, help=option.help)
        else:
            parser.add_argument(flag, dest=option.name, type=option.kind,
                                default=getattr(defaults, option.name),
                                metavar=option.metavar, help=option.help)


def add_backend_option(parser) -> None:
    """``--backend NAME`` (fpsim train, reproduce and sweep): the array library computing."""
    parser.add_argument("--backend", default=None,
                        help=f"array library to compute with, the same bits on each: "
                             f"{backend.accepted()} (default: the FPSIM_BACKEND environment "
                             f"variable, else numpy); run records name it")


def chosen_backend(name: "str | None"):
    """``--backend``'s context: that backend for the command (a missing library or device is
    a ValueError saying what to install), or the current one when not given."""
    return backend.use_backend(name) if name is not None else nullcontext()


def recipe_line(recipe, master_fmt, scaler_config) -> str:
    """The summary's first line: the recipe's master copy and scaler, and for each default an
    option overrode, the recipe's own value beside the one used."""
    record = recipe_record(recipe, master_fmt, scaler_config)
    used = {"master": str(master_fmt) if master_fmt is not None else None,
            "scaler": scaler_name(scaler_config)}
    parts = []
    for key, value in used.items():
        text = f"{key} {value or 'none'}"
        if key in record["overrides"]:
            text += f" (--{key}; the recipe's is {record['recipe'][key] or 'none'})"
        parts.append(text)
    return f"recipe {recipe.policy}: {', '.join(parts)}"


def run(args: argparse.Namespace) -> int:
    """Train as the arguments say, on ``--backend``; returns the exit status
    (ValueError/TypeError propagate to the caller, which reports them with status 2)."""
    with chosen_backend(getattr(args, "backend", None)):
        return _train_as_told(args)


def _train_as_told(args: argparse.Namespace) -> int:
    config = TrainConfig(**{name: getattr(args, name) for name in OPTIONS})
    if args.plot and config.out is None:
        raise ValueError("--plot draws the run into its --out folder: give --out FOLDER too")
    result = train(config, progress=False if args.quiet else None)
    for note in result.notes:
        print(f"fpsim train: note: {note}", file=sys.stderr)
    if not args.quiet:
        resolved = resolve(config)
        print(recipe_line(resolved.recipe, result.optimizer.master_fmt, resolved.scaler))
        last = result.records[-1]
        skipped = sum(r.skipped for r in result.records)
        underflow = float(np.mean([r.underflow_fraction for r in result.records]))
        print(f"{len(result.records)} steps: final loss {last.loss:.6g} (bits {last.loss_bits}), "
              f"scale {result.scaler_state.scale:g}, {skipped} skipped, mean gradient "
              f"underflow {underflow:.3%}, loss sha256 {result.loss_hash[:16]}")
        if result.nonfinite_steps:
            print(f"warning: the loss was NaN or inf at {len(result.nonfinite_steps)} step(s), "
                  f"first at step {result.nonfinite_steps[0]}")
        if result.out is not None:
            written = ["run.json", f"trace.{config.trace_format}", "checkpoint.npz"]
            written += ["layers.jsonl"] * config.per_layer + ["fp8.jsonl"] * bool(result.fp8_names)
            print(f"wrote {result.out}/{', '.join(written)}")
        else:
            print("nothing written (no --out): give --out FOLDER to keep run.json, the trace "
                  "and a checkpoint")
    return 0
