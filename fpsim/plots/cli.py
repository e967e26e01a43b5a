"""``fpsim plot`` and ``fpsim compare``: look at your own runs.

    fpsim plot runs/mixed runs/bf16 --out runs/compare.png
    fpsim compare runs/mixed runs/mixed-again

A run is a folder written by ``fpsim train --out``, a trace file (JSON Lines or CSV), or a
framework's loss-scaler trace (``fpsim-scaler-trace``). ``compare`` exits 0 when the runs are
bit-identical, 1 when they differ, 2 on bad input.
"""
from __future__ import annotations

import argparse

__all__ = ["register", "run", "COMMANDS"]

COMMANDS = ("plot", "compare")


def register(commands) -> None:
    plot = commands.add_parser(
        "plot", help="draw runs' traces side by side (loss, scale, underflow, lost updates, "
                     "grad norm)",
        description="Draw the traces of one or more runs side by side: loss (skipped steps "
                    "marked x, NaN/inf losses marked at the top), loss scale, gradient "
                    "underflow, lost updates and gradient norm. A run is a folder written by "
                    "'fpsim train --out', a trace file (.jsonl or .csv), or a framework's "
                    "loss-scaler trace; interrupted runs are drawn up to their last step.")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run folder or trace file")
    plot.add_argument("--out", required=True,
                      help="figure to write: a .png or .svg file name")
    plot.add_argument("--per-layer", action="store_true",
                      help="draw one run's per-layer statistics (its layers.jsonl, written by "
                           "fpsim train --per-layer) as heatmaps, parameter x step, instead")
    plot.add_argument("--fp8", action="store_true",
                      help="draw one run's FP8 statistics (its fp8.jsonl, written under an FP8 "
                           "recipe) as heatmaps, quantized tensor x step: scale, saturated, "
                           "flushed")
    plot.add_argument("--label", action="append", default=None, metavar="TEXT",
                      help="a run's label in the legend, once per run in order (instead of "
                           "the run.json settings in which the runs differ) (default: "
                           "those settings)")
    compare = commands.add_parser(
        "compare", help="the first step and field where two runs differ, bit for bit",
        description="Compare two runs step by step and print the first step and field whose "
                    "values differ in their bits (both values with their bits and the whole "
                    "step side by side), or that the runs are bit-identical. Wall time is "
                    "not compared; the runs' layers.jsonl and fp8.jsonl are, value by value "
                    "(a malformed one is bad input). Exit status 0: bit-identical; 1: they "
                    "differ; 2: bad input.")
    compare.add_argument("run_a", metavar="RUN_A", help="run folder or trace file")
    compare.add_argument("run_b", metavar="RUN_B", help="run folder or trace file")


def run(args: argparse.Namespace) -> int:
    """Execute ``plot`` or ``compare``; ValueError/FileNotFoundError propagate to the caller,
    which reports them in one line with exit status 2."""
    from ..train.runs import compare_runs
    from .runs import open_run, plot_runs

    if args.command == "plot" and (args.per_layer or args.fp8):
        from .layers import plot_fp8, plot_layers
        option, file, draw, what = (("--per-layer", "layers.jsonl", plot_layers,
                                     "per-layer statistics") if args.per_layer else
                                    ("--fp8", "fp8.jsonl", plot_fp8, "FP8 statistics"))
        if len(args.runs) != 1 or args.label or (args.per_layer and args.fp8):
            raise ValueError(f"{option} draws one run (its {file}), without --label or the "
                             f"other table's option; got {len(args.runs)} run(s)")
        print(f"wrote {draw(args.runs[0], args.out)} ({what})")
        return 0
    if args.command == "plot":
        written = plot_runs(args.runs, args.out, labels=args.label)
        print(f"wrote {written} ({len(args.runs)} run(s))")
        return 0
    comparison = compare_runs(open_run(args.run_a), open_run(args.run_b))
    print(comparison)
    return 0 if comparison.identical else 1
