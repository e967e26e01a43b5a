"""``fpsim train``: a built-in model on built-in data, every step traced (``DESCRIPTION``
is its help text). Bad input (a zero learning rate, an unknown policy or preset, an unwritable
folder...) is reported in one line before training starts, with exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

import numpy as np

from .. import backend, nn
from ..autograd import get_policy, use_policy
from ..optim import SGD, Adam, AdamW, Optimizer
from .data import DATASETS
from .factories import MODELS, build_data, build_model, parse_arguments
from .losses import LOSSES
from .loop import ADJUSTABLE_ON_RESUME, resolve_scaler, train
from .recipes import recipe_for, recipe_record, scaler_name

__all__ = ["register", "run", "add_backend_option", "chosen_backend"]

OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


DESCRIPTION = """\
Train a built-in MLP on built-in data, every step traced, for example:

  fpsim train --data teacher --hidden 64,64 --policy 16-true --steps 500 --out runs/half

The precision string sets the recipe as Lightning does: master copy and loss scaler follow
from it (16-mixed: fp32 master, torch's dynamic scaler; bf16-mixed: fp32 master, no scaler;
32-true, 16-true, bf16-true: no master copy, no scaler); --master and --scaler override them,
and run.json and the summary line say so. Without --out nothing is written. Bad input is
reported in one line before training starts, with exit status 2."""


def register(commands) -> None:
    p = commands.add_parser("train", help="train a model (built-in or yours) and write a "
                            "per-step trace", description=DESCRIPTION)
    p.add_argument("--model", default="mlp",
                   help=f"model: {', '.join(MODELS)} (sized from the data), or MODULE:FACTORY, "
                        f"an importable function returning an fpsim.nn.Module")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the model's factory (repeatable; VALUE read as "
                        "JSON where it is: 8, 0.5, [8, 16], else as text)")
    p.add_argument("--data", default="teacher",
                   help=f"data set: {', '.join(DATASETS)}, or MODULE:FACTORY, an importable "
                        f"function returning an fpsim.train.Dataset")
    p.add_argument("--data-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the data set (images: size, channels, noise; "
                        "tokens: length; a factory: its own)")
    p.add_argument("--loss", default="auto",
                   help=f"{', '.join(LOSSES)}: auto is cross_entropy for labels, mse for "
                        f"regression targets")
    p.add_argument("--samples", type=int, default=2048, help="number of samples")
    p.add_argument("--features", type=int, default=16, help="input features")
    p.add_argument("--classes", type=int, default=4, help="classes")
    p.add_argument("--hidden", default="64,64", help="hidden layer sizes, comma-separated")
    p.add_argument("--activation", default="relu",
                   help=f"activation of the built-in mlp and cnn: {', '.join(nn.ACTIVATIONS)}")
    p.add_argument("--policy", default="16-mixed",
                   help="precision recipe: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, "
                        "an FP8/FP4 recipe (fp8-current, fp8-delayed, mxfp8, fp8-block, "
                        "nvfp4, mxfp4, mxfp6; ':key=value,...', keep=NAME holds a layer in "
                        "bf16), or jmp style params=...,compute=...,output=...")
    p.add_argument("--optimizer", default="sgd", help=f"{', '.join(OPTIMIZERS)}")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=0.0, help="weight decay")
    p.add_argument("--master", default=None,
                   help="master-weight format (fp32, ...), or 'none' to update the weights "
                        "directly (default: the recipe's: fp32 for 16-mixed and bf16-mixed, "
                        "none otherwise)")
    p.add_argument("--clip-norm", type=float, default=None,
                   help="clip the global gradient norm to this value (default: no clipping)")
    p.add_argument("--scaler", default=None,
                   help="none, dynamic (torch's GradScaler), static:N, or a preset: torch, "
                        "apex, deepspeed, deepspeed-fp16, megatron, tf-keras, keras3, jmp "
                        "(default: the recipe's: dynamic for 16-mixed, none otherwise)")
    p.add_argument("--steps", type=int, default=200, help="training steps")
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples per step, drawn with replacement; at most the data's sample "
                        "count (a larger batch is refused)")
    p.add_argument("--seed", type=int, default=0, help="seed for data, weights and batches")
    p.add_argument("--out", default=None,
                   help="folder for run.json, the trace and checkpoint.npz (default: write "
                        "nothing)")
    p.add_argument("--trace-format", default="jsonl", choices=("jsonl", "csv"),
                   help="trace file layout")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="steps between checkpoints (default: one at the end)")
    p.add_argument("--resume", default=None,
                   help="checkpoint.npz to continue from (default: none, a new run)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run that --out already holds (refused without this)")
    p.add_argument("--allow-change", action="append", default=[], metavar="FIELD",
                   choices=ADJUSTABLE_ON_RESUME,
                   help=f"let a resumed run change this setting "
                        f"({', '.join(ADJUSTABLE_ON_RESUME)}; repeatable); any other "
                        f"difference from the checkpoint is refused")
    p.add_argument("--per-layer", action="store_true",
                   help="also record, per parameter and step, the fraction of its gradient "
                        "values that underflowed, of its updates lost, and its largest "
                        "gradient magnitude: OUT/layers.jsonl (fpsim plot --per-layer draws "
                        "them)")
    p.add_argument("--plot", action="store_true",
                   help="also draw the run (fpsim plot) into OUT/trace.png at the end; needs "
                        "--out")
    add_backend_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")


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


def _sizes(text: str) -> list[int]:
    """'64,64' -> [64, 64]; '' -> [] (no hidden layer, as a sweep spec allows); anything else
    is refused, an empty part ('8,,8') included."""
    if not text.strip():
        return []
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdecimal() and int(part) >= 1 for part in parts):
        raise ValueError(f"--hidden takes comma-separated positive integers like 64,64 (or '' "
                         f"for no hidden layer), got {text!r}")
    return [int(part) for part in parts]


def run(args: argparse.Namespace) -> int:
    """Train as the arguments say, on ``--backend``; returns the exit status
    (ValueError/TypeError propagate to the caller, which reports them with status 2)."""
    with chosen_backend(getattr(args, "backend", None)):
        return _train_as_told(args)


def _train_as_told(args: argparse.Namespace) -> int:
    for option, value, low in (("--samples", args.samples, 1), ("--features", args.features, 1),
                               ("--classes", args.classes, 2), ("--steps", args.steps, 1),
                               ("--batch-size", args.batch_size, 1), ("--seed", args.seed, 0),
                               ("--checkpoint-every", args.checkpoint_every, 1)):
        if value is not None and value < low:
            raise ValueError(f"{option} must be an integer >= {low}, got {value}")
    if args.plot and args.out is None:
        raise ValueError("--plot draws the run into its --out folder: give --out FOLDER too")
    if args.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {args.optimizer!r}; choose {', '.join(OPTIMIZERS)}")
    policy = get_policy(args.policy)
    model_arguments = parse_arguments(args.model_arg, "--model-arg")
    data_arguments = parse_arguments(args.data_arg, "--data-arg")
    data = build_data(args.data, data_arguments, samples=args.samples, features=args.features,
                      classes=args.classes, seed=args.seed)
    if args.batch_size > len(data):
        raise ValueError(f"--batch-size must be at most the {len(data)} samples of the data "
                         f"(batches are drawn from them with replacement), got {args.batch_size}")
    rule_kwargs = dict(lr=args.lr, weight_decay=args.weight_decay)
    if args.optimizer == "sgd":
        rule_kwargs["momentum"] = args.momentum
    elif args.momentum:
        raise ValueError("--momentum is an SGD option; Adam has beta1")
    rule = OPTIMIZERS[args.optimizer](**rule_kwargs)
    recipe = recipe_for(policy)
    if args.master is None:
        master = recipe.master
    else:
        master = None if args.master.lower() == "none" else args.master
    scaler = resolve_scaler(recipe.scaler if args.scaler is None else args.scaler)
    with use_policy(policy):
        model = build_model(args.model, model_arguments, data, hidden=_sizes(args.hidden),
                            activation=args.activation, seed=args.seed)
        optimizer = Optimizer(model, rule, master=master, clip_norm=args.clip_norm)
    config = {"command": "train", "data": args.data, "samples": args.samples,
              "features": args.features, "classes": args.classes, "hidden": args.hidden,
              "activation": args.activation, "model_spec": args.model,
              "model_args": model_arguments, "data_args": data_arguments}
    result = train(model, data, optimizer=optimizer, scaler=scaler, policy=policy,
                   steps=args.steps, batch_size=args.batch_size, seed=args.seed, out=args.out,
                   trace_layout=args.trace_format, checkpoint_every=args.checkpoint_every,
                   resume=args.resume, progress=False if args.quiet else None, config=config,
                   overwrite=args.overwrite, allow_changes=args.allow_change, loss=args.loss,
                   per_layer=args.per_layer)
    for note in result.notes:
        print(f"fpsim train: note: {note}", file=sys.stderr)
    if not args.quiet:
        print(recipe_line(recipe, optimizer.master_fmt, scaler))
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
            print(f"wrote {result.out}/run.json, trace.{args.trace_format}, checkpoint.npz")
        else:
            print("nothing written (no --out): give --out FOLDER to keep run.json, the trace "
                  "and a checkpoint")
    return 0
