"""``fpsim train``: a built-in model on built-in data, every step traced.

    fpsim train --data teacher --hidden 64,64 --policy 16-mixed --scaler dynamic \\
                --optimizer sgd --lr 0.1 --steps 500 --out runs/mixed

Bad input (a zero learning rate, an unknown policy or preset, an unwritable folder...) is
reported in one line before training starts, with exit status 2.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import nn
from ..autograd import get_policy, use_policy
from ..optim import SGD, Adam, AdamW, Optimizer
from .data import DATASETS, make_dataset
from .loop import ADJUSTABLE_ON_RESUME, train

__all__ = ["register", "run"]

OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def register(commands) -> None:
    p = commands.add_parser("train", help="train a built-in model and write a per-step trace",
                            description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="teacher", help=f"data set: {', '.join(DATASETS)}")
    p.add_argument("--samples", type=int, default=2048, help="number of samples (2048)")
    p.add_argument("--features", type=int, default=16, help="input features (16)")
    p.add_argument("--classes", type=int, default=4, help="classes (4)")
    p.add_argument("--hidden", default="64,64", help="hidden layer sizes, comma-separated")
    p.add_argument("--activation", default="relu", help="relu, tanh, sigmoid or gelu")
    p.add_argument("--policy", default="16-mixed",
                   help="precision policy: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, "
                        "or params=...,compute=...,output=...")
    p.add_argument("--optimizer", default="sgd", help=f"{', '.join(OPTIMIZERS)}")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (0.1)")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (0)")
    p.add_argument("--master", default="fp32",
                   help="master-weight format, or 'none' to update the weights directly")
    p.add_argument("--clip-norm", type=float, default=None, help="clip the global grad norm")
    p.add_argument("--scaler", default="dynamic",
                   help="none, dynamic, static:N, or a preset: torch, apex, deepspeed, "
                        "megatron, tf-keras, keras3, jmp")
    p.add_argument("--steps", type=int, default=200, help="training steps (200)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (64)")
    p.add_argument("--seed", type=int, default=0, help="seed for data, weights and batches")
    p.add_argument("--out", default=None, help="output folder for run.json, trace, checkpoint")
    p.add_argument("--trace-format", default="jsonl", choices=("jsonl", "csv"))
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints")
    p.add_argument("--resume", default=None, help="checkpoint.npz to continue from")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run that --out already holds (refused without this)")
    p.add_argument("--allow-change", action="append", default=[], metavar="FIELD",
                   choices=ADJUSTABLE_ON_RESUME,
                   help=f"let a resumed run change this setting "
                        f"({', '.join(ADJUSTABLE_ON_RESUME)}; repeatable); any other "
                        f"difference from the checkpoint is refused")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--hidden takes comma-separated integers like 64,64, got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise ValueError(f"--hidden sizes must be positive, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    """Train as the arguments say; returns the exit status (ValueError/TypeError propagate to
    the caller, which reports them with status 2)."""
    for option, value, low in (("--samples", args.samples, 1), ("--features", args.features, 1),
                               ("--classes", args.classes, 2), ("--steps", args.steps, 1),
                               ("--batch-size", args.batch_size, 1),
                               ("--checkpoint-every", args.checkpoint_every, 1)):
        if value is not None and value < low:
            raise ValueError(f"{option} must be an integer >= {low}, got {value}")
    if args.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {args.optimizer!r}; choose {', '.join(OPTIMIZERS)}")
    policy = get_policy(args.policy)
    data = make_dataset(args.data, args.samples, args.features, args.classes, args.seed)
    rule_kwargs = dict(lr=args.lr, weight_decay=args.weight_decay)
    if args.optimizer == "sgd":
        rule_kwargs["momentum"] = args.momentum
    elif args.momentum:
        raise ValueError("--momentum is an SGD option; Adam has beta1")
    rule = OPTIMIZERS[args.optimizer](**rule_kwargs)
    master = None if args.master.lower() == "none" else args.master
    with use_policy(policy):
        model = nn.MLP([args.features, *_sizes(args.hidden), args.classes],
                       activation=args.activation, rng=args.seed)
        optimizer = Optimizer(model, rule, master=master, clip_norm=args.clip_norm)
    config = {"command": "train", "data": args.data, "samples": args.samples,
              "features": args.features, "classes": args.classes, "hidden": args.hidden,
              "activation": args.activation}
    result = train(model, data, optimizer=optimizer, scaler=args.scaler, policy=policy,
                   steps=args.steps, batch_size=args.batch_size, seed=args.seed, out=args.out,
                   trace_layout=args.trace_format, checkpoint_every=args.checkpoint_every,
                   resume=args.resume, progress=False if args.quiet else None, config=config,
                   overwrite=args.overwrite, allow_changes=args.allow_change)
    for note in result.notes:
        print(f"fpsim train: note: {note}", file=sys.stderr)
    if not args.quiet:
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
    return 0
