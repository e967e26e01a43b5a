"""The ``fpsim`` command line.

    fpsim --version
    fpsim formats                 the built-in formats and their exact constants
    fpsim describe VALUE -f FMT   a value rounded into a format and taken apart
    fpsim demo                    a short tour of what reduced precision does to numbers
    fpsim train [options]         train a built-in model, every step traced (fpsim train -h)
    fpsim reproduce [--quick]     rerun the paper's experiments: figures and summary
    fpsim plot RUN [RUN ...] --out FILE   draw runs' traces side by side (PNG or SVG)
    fpsim compare RUN_A RUN_B     where two runs first differ, bit for bit
    fpsim check-scaler TRACE      replay a framework's loss-scaler trace through a preset
    fpsim check-cast SRC --against THEIRS --format F   compare a framework's cast with ours
    fpsim sweep SPEC --out DIR    many training runs on Dask (fpsim sweep -h); sweep-plot draws

Bad input (an unknown format, a value that is not a number, a file that cannot be read)
prints one line, ``fpsim: error: ...``, saying what was wrong and what is accepted, and exits
with status 2; no traceback. Ctrl-C stops with one line and status 130; a closed pipe
(``fpsim formats | head -c 10``) ends quietly with status 141, as ``SIGPIPE`` would.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

import numpy as np

from . import formats
from ._version import __version__
from .describe import describe
from .rounding import MODES, round_to

__all__ = ["main"]


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Plain-text help for every command: description paragraphs wrapped to the terminal,
    indented lines (examples) kept as written, and each option's default shown unless it has
    none worth showing (None, False)."""

    def _fill_text(self, text, width, indent):
        import textwrap

        paragraphs = []
        for block in text.strip("\n").split("\n\n"):
            if block.startswith(" "):
                paragraphs.append(textwrap.indent(block, indent))
            else:
                paragraphs.append(textwrap.fill(" ".join(block.split()), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action):
        # identity, not ==: a default of 0 or 0.0 equals False and must still be shown
        if action.default is None or action.default is False or \
                "%(default)" in (action.help or "") or "(default:" in (action.help or ""):
            return action.help
        if action.default == []:
            return f"{action.help} (default: none)"
        return super()._get_help_string(action)


def _format_table() -> str:
    header = ("name", "bits", "exp", "man", "bias", "encoding", "max finite", "min normal",
              "min subnormal", "epsilon")
    rows = [header]
    for f in formats.builtins():
        rows.append((f.name, str(f.bits), str(f.exp_bits), str(f.man_bits), str(f.bias),
                     f.encoding, f"{f.max_finite:.6g}", f"2^{f.emin}",
                     f"2^{f.emin - f.man_bits}", f"2^-{f.man_bits}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("Names accepted: " + ", ".join(formats.names()) + ", and any 'eXmY'.")
    return "\n".join(lines)


def _demo() -> str:
    shown = ("fp32", "tf32", "bf16", "fp16", "e4m3fn", "e5m2")
    values = [0.1, 1 / 3, 1000.7, 65519.0, 2.0 ** -25 * 1.5, 1e-9]
    out = ["1. One value, six formats (round to nearest, ties to even):", ""]
    out.append("   " + "value".ljust(14) + "".join(name.rjust(16) for name in shown))
    for v in values:
        cells = [f"{round_to(v, name):.9g}".rjust(16) for name in shown]
        out.append("   " + f"{v:.9g}".ljust(14) + "".join(cells))

    rng = np.random.default_rng(0)
    grads = (rng.standard_normal(1_000_000) * 2.0 ** -20).astype(np.float32)
    out += ["", "2. Gradient underflow: 1,000,000 values N(0,1) * 2^-20 (float32) cast to fp16:"]
    for scale in (1, 8, 128, 32768):
        zeros = np.count_nonzero(round_to(grads * np.float32(scale), "fp16") == 0)
        out.append(f"   loss scale {scale:>6}: {zeros / grads.size:8.4%} become zero")
    bf_zeros = np.count_nonzero(round_to(grads, "bf16") == 0)
    out.append(f"   (bf16, no scaling: {bf_zeros / grads.size:.4%} become zero)")

    out += ["", "3. Update swamping: w + lr*g with w = 1.0 stored in fp16:"]
    for update in (2.0 ** -10, 2.0 ** -11, 2.0 ** -11 * 1.0001, 2.0 ** -12):
        new = round_to(1.0 + update, "fp16")
        out.append(f"   update {update:.6g}: weight becomes {new!r}"
                   + ("   (update lost)" if new == 1.0 else ""))
    out += ["", "Try: fpsim formats; fpsim describe 0.1 --format fp16"]
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fpsim", description="Bit-exact reduced-precision "
                                     "number formats and training simulation.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"fpsim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("formats", help="list the built-in number formats",
                        description="List the built-in number formats with their exact "
                                    "constants, and the names accepted.")
    commands.add_parser("demo", help="a short tour of reduced-precision effects",
                        description="A one-screen tour: one value in six formats, gradient "
                                    "underflow against loss scales, update swamping.")
    desc = commands.add_parser("describe", help="round a value into a format and show its bits",
                               description="Round a value into a format and show the stored "
                                           "value, its rounding error, bits and class.")
    # argparse takes "-inf" and "-1e-8" for options unless its negative-number pattern
    # (a private attribute, the one way to widen it) says they are numbers.
    desc._negative_number_matcher = re.compile(
        r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$|^-0x[0-9a-f.]+p[-+]?\d+$",
        re.IGNORECASE)
    desc.add_argument("value", help="a number, e.g. 0.1, 1e-8, -inf, 0x1p-24")
    desc.add_argument("-f", "--format", default="fp16", help="format name")
    desc.add_argument("-m", "--mode", default="nearest_even",
                      help=f"rounding mode: {', '.join(m for m in MODES if m != 'stochastic')}")
    from .conformance import cli as conformance_cli
    from .experiments import cli as experiments_cli
    from .plots import cli as plots_cli
    from .sweep import cli as sweep_cli
    from .train import cli as train_cli

    train_cli.register(commands)
    plots_cli.register(commands)
    experiments_cli.register(commands)
    conformance_cli.register(commands)
    sweep_cli.register(commands)
    for sub in commands.choices.values():
        sub.formatter_class = HelpFormatter
    return parser


def _parse_number(text: str) -> float:
    try:
        value = float.fromhex(text) if "0x" in text.lower() else float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number; give a decimal (0.1, 1e-8, inf) or a "
                         f"hexadecimal float (0x1p-24)") from None
    except OverflowError:
        value = math.inf
    if math.isinf(value) and "inf" not in text.lower():
        raise UsageError(f"{text!r} is beyond float64's range (about 1.8e308), so it would be "
                         f"read as infinity; write inf or -inf if that is meant")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 done, 1 a check found differences or an
    experiment failed, 2 bad input, 130 Ctrl-C, 141 closed pipe)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("fpsim: interrupted (Ctrl-C); files being written were left as they were",
              file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (``| head``): stop quietly, and keep Python from complaining when it
        # flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _run(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from .conformance import cli as conformance_cli

    try:
        if args.command in conformance_cli.COMMANDS:
            return conformance_cli.run(args)  # exit 0 agree, 1 differ, 2 bad input
        if args.command == "formats":
            print(_format_table())
        elif args.command == "demo":
            print(_demo())
        elif args.command == "describe":
            print(describe(_parse_number(args.value), args.format, args.mode))
        elif args.command == "train":
            from .train import cli as train_cli

            status = train_cli.run(args)
            if status == 0 and args.plot:
                from .plots import plot_runs

                written = plot_runs([args.out], f"{args.out}/trace.png")
                if not args.quiet:
                    print(f"wrote {written}")
            return status
        elif args.command in ("plot", "compare"):
            from .plots import cli as plots_cli

            return plots_cli.run(args)
        elif args.command == "reproduce":
            from .experiments import cli as experiments_cli

            return experiments_cli.run(args)
        elif args.command in ("sweep", "sweep-plot"):
            from .sweep import cli as sweep_cli

            return sweep_cli.run(args)
        else:
            parser.print_help()
        sys.stdout.flush()      # a closed pipe shows here, inside the handlers below
        return 0
    except BrokenPipeError:
        raise
    except (UsageError, ValueError, TypeError, KeyError, OSError, RecursionError,
            MemoryError) as err:
        print(f"fpsim: error: {_one_line(err)}", file=sys.stderr)
        return 2


def _one_line(err: BaseException) -> str:
    """What went wrong, in one line: an OS error names its file; the rest give their message."""
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        return f"{where}{err.strerror}"
    if isinstance(err, MemoryError):
        detail = f" ({err})" if str(err) else ""
        return f"not enough memory for the sizes asked for{detail}; use smaller ones"
    if isinstance(err, RecursionError):
        return "the input is nested too deeply to read"
    if isinstance(err, KeyError):
        # a bare key name ("fpsim: error: lr") says nothing; a KeyError that carries a
        # sentence keeps it
        key = err.args[0] if err.args else None
        if isinstance(key, str) and " " in key.strip():
            return key
        return (f"an entry {key!r} is missing from the input (a file read back lacks it, or a "
                f"name given is unknown); check the files and names given")
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
