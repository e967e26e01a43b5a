"""Bad input gets one clear line and exit status 2 from the CLI (never a traceback), and the
API names the argument and what it accepts; a comparison of nothing is an error."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fpsim import Tensor, formats, nn, round_to, use_policy
from fpsim.cli import main
from fpsim.conformance.cast_check import check_cast
from fpsim.optim import SGD, Optimizer
from fpsim.train import Dataset, make_dataset, train
from test_conformance_cli import FLAGS, write_preset_trace
from test_resume_checked import npy_header
from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fpsim"), captured.err
    assert ": error: " in lines[0] and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("value,shown", [("-inf", "-inf in fp16"), ("-1e-8", "-1e-08 in fp16"),
                                         ("-0x1p-24", "-5.960464477539063e-08 in fp16")])
def test_describe_takes_negative_numbers(capsys, value, shown):
    assert main(["describe", value]) == 0
    assert capsys.readouterr().out.startswith(shown)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


HEADER = '{"format": "fpsim-scaler-trace", "version": 1, "params": %s}\n'


def test_cli_input_failures_are_one_line_and_exit_2(tmp_path, capsys):
    deep = write(tmp_path / "deep.jsonl", HEADER % ("[" * 100_000 + "]" * 100_000))
    huge = write(tmp_path / "huge.jsonl", HEADER % '{"init_scale": 1e999}')
    digits = write(tmp_path / "digits.jsonl", HEADER % ('{"init_scale": ' + "9" * 5000 + "}"))
    empty = write(tmp_path / "empty.jsonl", HEADER % "{}")
    src = tmp_path / "x.npy"
    np.save(src, np.float32([1.0, 2.0]))
    lying = tmp_path / "lying.npy"
    lying.write_bytes(npy_header("<f4", (10**12,)) + bytes(8))
    long_header = tmp_path / "long.npy"
    long_header.write_bytes(b"\x93NUMPY\x01\x00" + (60000).to_bytes(2, "little") + b" " * 60000)
    np.save(tmp_path / "none.npy", np.zeros(0, np.float32))
    np.save(tmp_path / "rec.npy", np.zeros(2, [("a", "u1"), ("b", "u1")]))
    cases = [
        (["check-scaler", str(tmp_path), "--preset", "torch"], "Is a directory"),
        (["check-scaler", str(deep), "--preset", "torch"], "line 1: nested too deeply"),
        (["check-scaler", str(huge), "--preset", "torch"], "1e999 is beyond float range"),
        (["check-scaler", str(digits), "--preset", "torch"], "line 1: Exceeds the limit"),
        (["check-scaler", str(empty), "--preset", "torch"], "no steps: nothing to compare"),
        (["check-cast", str(lying), "-f", "fp16", "--against", str(src)],
         "header says 1000000000000 items of float32"),
        (["check-cast", str(long_header), "-f", "fp16", "--against", str(src)],
         "header is 60000 bytes long"),
        (["check-cast", str(tmp_path), "-f", "fp16", "--against", str(src)], "is a folder"),
        (["check-cast", str(tmp_path / "none.npy"), "-f", "fp16", "--against",
          str(tmp_path / "none.npy")], "the source is empty"),
        (["check-cast", str(tmp_path / "rec.npy").replace("rec", "x"), "-f", "e5m2", "--bits",
          "--against", str(tmp_path / "rec.npy")], "structured array"),
        (["describe", "1e999"], "'1e999' is beyond float64's range"),
        (["describe", "0x1p99999"], "beyond float64's range"),
        (["train", "--samples", "0"], "samples (--samples) must be a positive integer, got 0"),
        (["train", "--classes", "1"], "classes (--classes) must be an integer >= 2, got 1"),
        (["train", "--lr", "inf"], "lr (--lr) must be a number in (0.0, inf), got inf"),
        (["train", "--samples", str(10**14)], "not enough memory"),
        (["train", "--resume", str(tmp_path)], "no checkpoint at"),
        (["train", "--out", str(src), "--steps", "1", "--samples", "64"],
         "cannot write the output folder"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        assert words in one_error_line(capsys), argv


def test_a_torch_trace_against_deepspeed_names_the_flag(tmp_path, capsys):
    trace = write_preset_trace(tmp_path / "torch.jsonl", "torch", FLAGS, init_scale=65536.0,
                               backoff_factor=0.5, growth_interval=2000)
    assert main(["check-scaler", str(trace), "--preset", "deepspeed"]) == 2
    assert "pass --ignore-header-params" in one_error_line(capsys)
    assert main(["check-scaler", str(trace), "--preset", "deepspeed",
                 "--ignore-header-params"]) == 1       # compared: deepspeed differs from torch


@pytest.mark.skipif(os.name == "posix" and os.geteuid() == 0,
                    reason="root reads files whatever their permissions")
def test_an_unreadable_file_is_named(tmp_path, capsys):
    trace = write_preset_trace(tmp_path / "t.jsonl", "torch", FLAGS)
    trace.chmod(0)
    assert main(["check-scaler", str(trace), "--preset", "torch"]) == 2
    assert "Permission denied" in one_error_line(capsys)


def test_ml_dtypes_float8_e5m2_files_are_read(tmp_path, capsys):
    source = np.float32([1.0, 1e-6, 3e5, -0.3, np.inf])
    np.save(tmp_path / "src.npy", source)
    np.save(tmp_path / "e5m2.npy", source.astype(ml_dtypes.float8_e5m2))   # descr '<f1'
    assert main(["check-cast", str(tmp_path / "src.npy"), "-f", "e5m2", "--against",
                 str(tmp_path / "e5m2.npy")]) == 0
    assert "5 values, all match" in capsys.readouterr().out


def test_big_endian_data_is_read_as_its_values(tmp_path, capsys):
    values = np.float32([0.1, 1e-6, -6e4])
    assert round_to(values.astype(">f4"), "fp16").tobytes() == round_to(values, "fp16").tobytes()
    np.save(tmp_path / "be.npy", values.astype(">f4"))
    np.save(tmp_path / "theirs.npy", values.astype(np.float16).astype(">f2"))
    assert main(["check-cast", str(tmp_path / "be.npy"), "-f", "fp16", "--against",
                 str(tmp_path / "theirs.npy")]) == 0
    capsys.readouterr()


def test_api_arguments_are_named_with_what_is_accepted():
    cases = [
        (lambda: formats.custom(5, 10, bias="15"), TypeError, "bias must be an int, got '15'"),
        (lambda: formats.custom(5, 10, bias=15.5), TypeError, "bias must be an int"),
        (lambda: formats.custom(0, 3), ValueError, "exp_bits must be 2..8"),
        (lambda: formats.custom(5, 10, subnormals="no"), TypeError,
         "subnormals must be True or False"),
        (lambda: round_to(1e-6, "fp16", subnormals="no"), TypeError,
         "subnormals must be True, False or None"),
        (lambda: round_to(1e5, "fp16", saturate="yes"), TypeError, "saturate must be True"),
        (lambda: nn.Linear(0, 4), ValueError, "in_features must be a positive integer, got 0"),
        (lambda: nn.Linear(4, -1), ValueError, "out_features must be a positive integer"),
        (lambda: SGD(lr=float("inf")), ValueError, r"lr must be a number in \(0.0, inf\)"),
        (lambda: Dataset(np.array([[1e300, 1.0]]), np.array([0]), 2), ValueError,
         "overflow float32 .* sample 0, feature 0"),
        (lambda: check_cast(np.float32([]), np.float16([]), "fp16"), ValueError,
         "the source is empty"),
        (lambda: check_cast(np.float32([1, 2]), np.zeros(2, [("a", "u2")]), "fp16", bits=True),
         TypeError, "structured array"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind, match=message):
            make()
    assert formats.custom(5, 10, bias=np.int64(15)) == formats.FP16


def test_an_optimizer_built_for_another_model_is_refused(tmp_path):
    data = make_dataset("blobs", n=64, features=4, classes=2, seed=0)
    with use_policy("16-mixed"):
        model, other = nn.MLP([4, 8, 2], rng=0), nn.MLP([4, 8, 2], rng=0)
        optimizer = Optimizer(other, SGD(lr=0.1))
    with pytest.raises(ValueError, match="the optimizer was built for another model"):
        train(model, data, optimizer=optimizer, steps=2, out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_console_command_never_prints_a_traceback(tmp_path):
    deep = write(tmp_path / "deep.jsonl", HEADER % ("[" * 100_000 + "]" * 100_000))
    done = subprocess.run([sys.executable, "-m", "fpsim", "check-scaler", str(deep), "--preset",
                           "torch"], capture_output=True, text=True,
                          env=child_env())
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags,words", [
    (["--lr", "1e-60"], "lr (--lr)=1e-60 is 0.0 in float32"),
    (["--lr", "1e39"], "lr (--lr)=1e+39 is inf in float32"),
    (["--clip-norm", "1e-60"], "clip_norm (--clip-norm)=1e-60 is 0.0 in float32"),
])
def test_values_float32_turns_into_refused_ones_are_refused(tmp_path, capsys, flags, words):
    out = tmp_path / "run"
    assert main(["train", "--steps", "2", "--out", str(out)] + flags) == 2
    assert words in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("make,words", [
    (lambda: nn.MLP([4, 8.9, 2]), "MLP sizes[1] must be a positive integer, got 8.9"),
    (lambda: nn.MLP([4, "8", 2]), "MLP sizes[1] must be a positive integer, got '8'"),
    (lambda: nn.MLP([4]), "at least two sizes"),
    (lambda: nn.LSTM(0, 4), "input_size must be a positive integer"),
    (lambda: nn.LSTM(4, 2.0), "hidden_size must be a positive integer"),
    (lambda: Tensor([1.0], requires_grad="yes"), "requires_grad must be True or False"),
    (lambda: Dataset(np.zeros((2, 2), np.float32), np.zeros(2, int), 2.5),
     "classes must be an integer >= 2, got 2.5"),
])
def test_python_does_not_coerce_constructor_arguments(make, words):
    with pytest.raises((ValueError, TypeError)) as err:
        make()
    assert words in str(err.value)


@pytest.mark.parametrize("bits,words", [
    (np.array([-1], np.int64), "got -1"),
    (np.array([0x3C00, 70000, 80000], np.int64), "got 0x11170 (and 1 more outside)"),
    (np.array([2 ** 64 - 1], np.uint64), "got 0xffffffffffffffff"),
])
def test_decode_names_the_pattern_outside_the_format(bits, words):
    from fpsim.encoding import decode
    with pytest.raises(ValueError, match="bit patterns for fp16 are 0..0xffff") as err:
        decode(bits, "fp16")
    assert words in str(err.value)


@pytest.mark.parametrize("retries,kind", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_run_sweep_refuses_a_retry_count_that_is_not_one(tmp_path, retries, kind):
    from fpsim.sweep import run_sweep
    with pytest.raises(kind, match="retries must be an integer >= 0"):
        run_sweep(None, tmp_path / "out", retries=retries)
    assert not (tmp_path / "out").exists()
