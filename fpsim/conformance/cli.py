"""The ``check-scaler`` and ``check-cast`` subcommands of ``fpsim``.

    fpsim check-scaler TRACE --preset NAME [--param KEY=VALUE ...] [--ignore-header-params]
                       [--expect KEY=VALUE ...] [--expect-preset NAME]
    fpsim check-cast ARRAY.npy --format FMT --against OTHER.npy [--bits] [--mode MODE]
                     [--saturate] [--flush-subnormals] [--examples N]
                     [--mx-scales CODES.npy [--mx-rule spec|rceil] [--block N]]

Exit status: 0 when the framework agrees with the reference, 1 when it does not (the first
divergence, or the mismatches by class, are printed; or a recorded setting is not the one
``--expect``/``--expect-preset`` intended: one ``MISCONFIGURED`` line each), 2 on bad input
(a trace that breaks the format, an unknown preset or parameter, a missing or unreadable
array, a shape or dtype that does not fit).

``register(subparsers)`` adds both subcommands to an ``argparse`` subparsers object;
``run(args)`` executes a parsed command and returns the exit status; ``main(argv)`` does both
on its own parser (``python -m fpsim.conformance.cli``).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from ..formats import get
from ..rounding import MODES
from ..scaling import DynamicScaler, preset, preset_names
from .cast_check import check_cast, load_array
from .expect import check_settings
from .mx_check import check_mx_cast
from .replay import reference_state, replay
from .trace import read_trace

__all__ = ["register", "run", "main", "parse_param", "COMMANDS"]

COMMANDS = ("check-scaler", "check-cast")
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DynamicScaler)}
_OPTIONAL_FLOATS = ("min_scale", "max_scale")


class UsageError(ValueError):
    """Bad command-line input: one line on stderr, exit status 2."""


def register(subparsers) -> None:
    """Add ``check-scaler`` and ``check-cast`` to ``subparsers`` (from
    ``parser.add_subparsers(dest="command")``)."""
    scaler = subparsers.add_parser(
        "check-scaler", help="replay a recorded loss-scaler trace through a preset",
        description="Replay a scaler trace (fpsim-scaler-trace JSON Lines) through a preset "
                    "and print the first step where they part. Exit 0: they agree; 1: they "
                    "diverge; 2: bad input.")
    scaler.add_argument("trace", help="the trace file (.jsonl)")
    scaler.add_argument("--preset", required=True,
                        help=f"reference preset: {', '.join(preset_names())}")
    scaler.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset parameter, e.g. growth_interval=100, "
                             "init_scale=2**16, min_scale=none (repeatable; applied after the "
                             "trace header's params)")
    scaler.add_argument("--ignore-header-params", action="store_true",
                        help="do not apply the configuration recorded in the trace header")
    scaler.add_argument("--expect", action="append", default=[], metavar="KEY=VALUE",
                        help="the setting the real scaler was meant to have, e.g. "
                             "growth_interval=2000 (repeatable): exit 1 when the trace header "
                             "records another value, or none")
    scaler.add_argument("--expect-preset", metavar="NAME",
                        help="the settings the trace header records must be preset NAME's "
                             "documented defaults (--expect values take precedence)")
    cast = subparsers.add_parser(
        "check-cast", help="compare a framework's cast of an array with fpsim's rounding",
        description="Round ARRAY (float32/float64 .npy) to FORMAT and compare with a "
                    "framework's cast of it; mismatches are counted by class (normal, "
                    "subnormal, zero, overflow, infinity, nan). Exit 0: all match; 1: "
                    "mismatches; 2: bad input.")
    cast.add_argument("array", help="the source values (.npy, float32 or float64)")
    cast.add_argument("-f", "--format", required=True, help="target format, e.g. fp16, bf16, "
                      "e4m3fn, e5m2")
    cast.add_argument("--against", required=True, metavar="OTHER.npy",
                      help="the framework's cast: float16/bfloat16/float8 (ml_dtypes), float32/"
                           "float64 values, or bit patterns with --bits")
    cast.add_argument("--bits", action="store_true",
                      help="OTHER holds raw bit patterns (uint8/uint16, int8/int16)")
    cast.add_argument("-m", "--mode", default="nearest_even",
                      help=f"our rounding mode: {', '.join(m for m in MODES if m != 'stochastic')}")
    cast.add_argument("--saturate", action="store_true",
                      help="overflow goes to the largest finite value (torch's float8_e4m3fn "
                           "cast does this)")
    cast.add_argument("--flush-subnormals", action="store_true",
                      help="subnormal results flush to zero (a flush-to-zero framework)")
    cast.add_argument("--examples", type=int, default=10, metavar="N",
                      help="show the first N mismatches (default 10)")
    cast.add_argument("--mx-scales", metavar="CODES.npy",
                      help="MX mode: the framework's E8M0 scale codes (uint8, one per block "
                           "of the last axis; torchao: scale.view(torch.uint8)); the scale of "
                           "every block is checked, then the elements (OTHER) of the blocks "
                           "whose scales agree")
    cast.add_argument("--mx-rule", default="spec", choices=("spec", "rceil"),
                      help="MX scale rule: spec (OCP floor; torchao's FLOOR, the default) or "
                           "rceil (Transformer Engine's MXFP8)")
    cast.add_argument("--block", type=int, default=32, metavar="N",
                      help="MX block size (default 32)")


def parse_param(text: str, option: str = "--param") -> tuple[str, object]:
    """``"growth_interval=100"`` -> ``("growth_interval", 100)``, typed by the
    ``DynamicScaler`` field: ints, floats (``65536``, ``2**16``, ``0x1p16``, ``inf``), bools
    (true/false), ``none`` for min_scale/max_scale, and words for the choice fields.
    ``option`` names the option in error messages (``--param``, ``--expect``)."""
    try:
        return _parse_param(text)
    except UsageError as err:
        raise UsageError(str(err).replace("--param ", f"{option} ", 1)) from None


def _parse_param(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise UsageError(f"--param {text!r}: write KEY=VALUE, e.g. growth_interval=100")
    if key not in _FIELD_DEFAULTS or key in ("name", "source"):
        keys = [k for k in _FIELD_DEFAULTS if k not in ("name", "source")]
        raise UsageError(f"--param {text!r}: unknown parameter {key!r}; known: "
                         f"{', '.join(keys)}")
    default = _FIELD_DEFAULTS[key]
    if key in _OPTIONAL_FLOATS and raw.lower() in ("none", "null"):
        return key, None
    if isinstance(default, bool):
        if raw.lower() in ("true", "1", "yes"):
            return key, True
        if raw.lower() in ("false", "0", "no"):
            return key, False
        raise UsageError(f"--param {text!r}: {key} is true or false")
    if isinstance(default, int):
        try:
            return key, int(raw)
        except ValueError:
            raise UsageError(f"--param {text!r}: {key} is an integer") from None
    if isinstance(default, float) or key in _OPTIONAL_FLOATS:
        return key, _parse_float(raw, text, key)
    return key, raw


def _parse_float(raw: str, text: str, key: str) -> float:
    power = re.fullmatch(r"([0-9.]+)\s*(?:\*\*|\^)\s*(-?[0-9]+)", raw)
    try:
        if power:
            return float(power[1]) ** int(power[2])
        if "0x" in raw.lower():
            return float.fromhex(raw)
        return float(raw)
    except (ValueError, OverflowError):
        raise UsageError(f"--param {text!r}: {key} is a number (65536, 2**16, 0x1p16)") \
            from None


def header_param_mapping(params: dict, preset_name: str, overrides: dict) -> dict:
    """The header's parameters in the preset's conventions, where they differ: a
    ``backoff_factor`` below 1 is a multiplier (torch, Megatron: the scale times 0.5), which a
    preset that divides by its factor (DeepSpeed, apex, Keras, jmp: the scale over 2) takes as
    its reciprocal. Only values the overrides leave alone are mapped."""
    reference = preset(preset_name)
    factor = params.get("backoff_factor")
    mapped = {}
    if ("backoff_factor" not in overrides and isinstance(factor, (int, float))
            and 0 < factor < 1 and reference.backoff_op == "divide"):
        mapped["backoff_factor"] = 1 / factor
    return mapped


def _expectations(args) -> dict:
    """The ``--expect`` settings (a key given twice is refused), after ``--expect-preset``
    is known to name a preset."""
    if args.expect_preset is not None:
        preset(args.expect_preset)
    expected: dict = {}
    for text in args.expect:
        key, value = parse_param(text, "--expect")
        if key in expected:
            raise UsageError(f"--expect {text!r}: {key} is already expected "
                             f"({expected[key]!r}); give each setting once")
        expected[key] = value
    return expected


def _check_overrides_alone(preset_name: str, overrides: dict) -> None:
    """Refuse ``--param`` values the preset cannot take even without the trace header, naming
    them (not the header): ``min_scale=none`` with a preset that raises at its minimum."""
    try:
        reference_state(preset_name, overrides)
    except (ValueError, TypeError) as err:
        given = " ".join(f"--param {k}={v!r}" for k, v in overrides.items())
        hint = ("; add --param raise_at_min=false (no floor, so nothing to raise at)"
                if "raise_at_min" in str(err) and "raise_at_min" not in overrides else "")
        raise UsageError(f"{given}: preset {preset_name!r} cannot take it: {err}{hint}") \
            from None


def _overrides(texts) -> dict:
    """The ``--param`` settings; a parameter given twice is refused (the last would win
    without a word)."""
    overrides: dict = {}
    for text in texts:
        key, value = parse_param(text)
        if key in overrides:
            raise UsageError(f"--param {text!r}: {key} is already set ({overrides[key]!r}); "
                             f"give each parameter once")
        overrides[key] = value
    return overrides


def _check_scaler(args) -> int:
    preset(args.preset)           # an unknown name is refused as such, before the trace is read
    overrides = _overrides(args.param)
    expected = _expectations(args)
    _check_overrides_alone(args.preset, overrides)
    try:
        trace = read_trace(args.trace)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    if expected or args.expect_preset is not None:
        misconfigured = check_settings(trace.header.params, expected, preset=args.expect_preset)
        if misconfigured:
            print("\n".join(misconfigured))
            return 1
    try:
        report = replay(trace, args.preset, use_header_params=not args.ignore_header_params,
                        **overrides)
    except (ValueError, TypeError) as err:
        if args.ignore_header_params or not trace.header.params:
            raise
        mapped = header_param_mapping(trace.header.params, args.preset, overrides)
        how = (f"map them with {' '.join(f'--param {k}={v!r}' for k, v in mapped.items())}, or "
               if mapped else "")
        raise UsageError(f"{err}; the trace header's params are the recording framework's "
                         f"settings ({', '.join(trace.header.params)}), which may not mean what "
                         f"they mean to preset {args.preset!r}: {how}pass "
                         f"--ignore-header-params to use the preset's own defaults") from None
    print(report)
    return 0 if report.agree else 1


def _check_mx_options(args) -> None:
    """MX casts round to nearest even with saturation, in blocks; refuse what does not fit."""
    if args.mode != "nearest_even" or args.flush_subnormals:
        raise UsageError("--mx-scales: an MX cast rounds to nearest even with saturation; "
                         "drop --mode and --flush-subnormals")
    if args.block < 1:
        raise UsageError(f"--block must be >= 1, got {args.block}")


def _check_cast(args) -> int:
    fmt = get(args.format)
    if args.mx_scales is not None:
        _check_mx_options(args)
    if args.saturate:
        fmt = fmt.replace(saturate=True)
    if args.flush_subnormals:
        fmt = fmt.replace(subnormals=False)
    if args.examples < 0:
        raise UsageError(f"--examples must be >= 0, got {args.examples}")
    try:
        source = load_array(args.array, "source")
        result = load_array(args.against, "--against")
        codes = None if args.mx_scales is None else load_array(args.mx_scales, "--mx-scales")
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None
    if codes is not None:
        mx_report = check_mx_cast(source, result, codes, fmt, rule=args.mx_rule,
                                  block=args.block, bits=args.bits, max_examples=args.examples)
        print(mx_report)
        return 0 if mx_report.agree else 1
    report = check_cast(source, result, fmt, mode=args.mode, bits=args.bits,
                        max_examples=args.examples)
    print(report)
    return 0 if report.agree else 1


def run(args) -> int:
    """Execute a parsed ``check-scaler``/``check-cast`` command; returns the exit status
    (0 agree, 1 differ, 2 bad input, with the reason on stderr)."""
    handlers = {"check-scaler": _check_scaler, "check-cast": _check_cast}
    command = getattr(args, "command", None)
    if command not in handlers:
        print(f"fpsim: error: not a conformance command: {command!r}", file=sys.stderr)
        return 2
    try:
        return handlers[command](args)
    except (ValueError, TypeError) as err:    # TraceFormatError and UsageError included
        print(f"fpsim {command}: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fpsim")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
