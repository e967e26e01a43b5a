"""The fpsim command: output users read, and exit status 2 on bad input."""
import subprocess
import sys

import pytest

from fpsim import __version__
from fpsim.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"fpsim {__version__}"


def test_formats_table(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    for row in ("fp16      16    5    10   15    ieee      65504",
                "e4m3fn    8     4    3    7     fn        448",
                "e4m3fnuz  8     4    3    8     fnuz      240"):
        assert row in out


def test_describe(capsys):
    assert main(["describe", "0x1p-24", "-f", "half"]) == 0
    out = capsys.readouterr().out
    assert "0 00000 0000000001" in out and "subnormal" in out


def test_demo_shows_the_three_effects(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Gradient underflow" in out and "(update lost)" in out
    assert "loss scale  32768:  0.0001% become zero" in out


@pytest.mark.parametrize("argv,message", [
    (["describe", "0.1", "-f", "fp17"], "unknown format 'fp17'"),
    (["describe", "abc"], "'abc' is not a number"),
    (["describe", "1", "-m", "sideways"], "unknown rounding mode 'sideways'"),
])
def test_bad_input_exits_2_with_a_reason(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_console_entry_point_is_installed():
    done = subprocess.run([sys.executable, "-m", "fpsim", "formats"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0 and "bf16" in done.stdout


def test_train_command_writes_run_trace_and_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "6", "--samples", "128", "--hidden", "16",
                 "--out", str(out), "--checkpoint-every", "3"]) == 0
    printed = capsys.readouterr().out
    assert "6 steps: final loss" in printed and "loss sha256" in printed
    assert {p.name for p in out.iterdir()} == {"run.json", "trace.jsonl", "checkpoint.npz"}
    assert main(["train", "--steps", "9", "--samples", "128", "--hidden", "16",
                 "--out", str(out), "--resume", str(out / "checkpoint.npz"), "--quiet"]) == 0
    assert len((out / "trace.jsonl").read_text().splitlines()) == 9


@pytest.mark.parametrize("argv,message", [
    (["train", "--lr", "0"], "lr (--lr) must be a number in (0.0, inf)"),
    (["train", "--scaler", "nvidia"], "unknown scaler 'nvidia'"),
    (["train", "--policy", "fp17-mixed"], "unknown precision policy"),
    (["train", "--optimizer", "lion"], "unknown optimizer (--optimizer) 'lion'"),
    (["train", "--hidden", "64,x"], "hidden (--hidden) takes comma-separated positive integers"),
    (["train", "--hidden", "8,,8"], "hidden (--hidden) takes comma-separated positive integers"),
    (["train", "--hidden", "8,0"], "hidden (--hidden) takes comma-separated positive integers"),
    (["train", "--resume", "/nonexistent/checkpoint.npz"], "no checkpoint at"),
])
def test_train_bad_input_exits_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
