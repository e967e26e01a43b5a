"""Nothing lost: outputs are whole or absent, a run folder is never replaced silently or
written by two processes at once, and ``reproduce --only`` keeps the other summaries.

The subprocess tests send real signals to a real ``fpsim`` process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_process import ctrl_c_reaches_python

from fpsim import experiments
from fpsim.cli import main
from fpsim.experiments import Experiment, Result
from fpsim.files import LOCK_NAME, FolderInUse, folder_lock
from fpsim.train import read_trace
from child_env import child_env

ROOT = Path(__file__).resolve().parents[1]
ENV = child_env(CI="1")
SMALL = ["--samples", "128", "--features", "4", "--hidden", "8", "--batch-size", "8"]
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def fpsim(*argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "fpsim", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=ctrl_c_reaches_python, **kwargs)


def wait_for(predicate, timeout=60.0, every=0.001):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def test_ctrl_c_while_a_figure_is_written_leaves_old_or_new_whole_files(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    old = {"underflow_histogram.png": b"OLD PNG", "underflow_histogram.svg": b"OLD SVG"}
    for name, data in old.items():
        (out / name).write_bytes(data)
    (out / "summary.md").write_text("old summary\n")
    caught = None
    for _ in range(3):       # the figure write must be caught in the act; retry if missed
        proc = fpsim("reproduce", "--quick", "--only", "underflow", "--out", str(out),
                     "--quiet")
        writing = wait_for(lambda proc=proc: proc.poll() is not None or any(
            p.name.endswith(".tmp") and ".underflow_histogram." in p.name
            for p in out.iterdir()))
        if writing and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            caught = proc
            break
        proc.communicate()
    assert caught is not None, "never saw a figure being written"
    stdout, stderr = caught.communicate(timeout=60)
    assert caught.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        "fpsim: interrupted (Ctrl-C); files being written were left as they were"]
    for name, data in old.items():          # each figure: the old file, or a whole new one
        now = (out / name).read_bytes()
        assert now == data or (now.endswith(PNG_END) if name.endswith(".png")
                               else now.rstrip().endswith(b"</svg>")), name
    assert (out / "summary.md").read_text() == "old summary\n"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp") or p.name == LOCK_NAME]


def test_two_trainers_on_one_folder_the_second_is_refused(tmp_path):
    out = tmp_path / "run"
    first = fpsim("train", *SMALL, "--steps", "100000", "--out", str(out), "--quiet")
    try:
        assert wait_for(lambda: (out / "trace.jsonl").exists()
                        and (out / "trace.jsonl").stat().st_size > 0)
        second = fpsim("train", *SMALL, "--steps", "5", "--out", str(out), "--overwrite")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert f"is being written by process {first.pid}" in err and LOCK_NAME in err
        assert len(err.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "Traceback" not in err
    steps = [r.step for r in read_trace(out / "trace.jsonl")]   # one run's steps, whole lines
    assert steps == list(range(len(steps))) and not (out / LOCK_NAME).exists()


def test_kill_9_leaves_a_stale_lock_that_a_resume_takes_over(tmp_path):
    out = tmp_path / "run"
    victim = fpsim("train", *SMALL, "--steps", "100000", "--checkpoint-every", "5", "--out",
                   str(out), "--quiet")
    assert wait_for(lambda: (out / "checkpoint.npz").exists())
    victim.kill()
    victim.communicate()
    assert (out / LOCK_NAME).read_text().split()[0] == str(victim.pid)
    done = subprocess.run([sys.executable, "-m", "fpsim", "train", *SMALL, "--steps", "300",
                           "--out", str(out), "--resume", str(out / "checkpoint.npz"),
                           "--quiet"], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    assert f"took over the stale lock {out / LOCK_NAME} of process {victim.pid}" in done.stderr
    assert [r.step for r in read_trace(out / "trace.jsonl")] == list(range(300))
    assert not (out / LOCK_NAME).exists()


def test_reproduce_says_when_it_takes_over_a_stale_lock_even_quiet(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (out / LOCK_NAME).write_text(f"{dead} {__import__('socket').gethostname()}\n")
    done = subprocess.run([sys.executable, "-m", "fpsim", "reproduce", "--quick", "--only",
                           "underflow", "--out", str(out), "--quiet"], capture_output=True,
                          text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (f"fpsim reproduce: note: took over the stale lock "
                                   f"{out / LOCK_NAME} of process {dead}, which no longer runs "
                                   f"(it was stopped without cleaning up)")


def test_a_live_lock_is_refused_and_released_on_errors(tmp_path):
    with folder_lock(tmp_path) as note:
        assert note is None
        with pytest.raises(FolderInUse, match=f"process {os.getpid()} on"):
            with folder_lock(tmp_path):
                pass
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text("garbage")
    with pytest.raises(FolderInUse, match="does not say which.*delete"):
        with folder_lock(tmp_path):
            pass


TRAIN = ["train", *SMALL, "--steps", "4", "--quiet"]


def test_train_into_a_folder_holding_a_run_refuses_unless_asked(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*TRAIN, "--out", str(out), "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*TRAIN, "--out", str(out), "--seed", "1", "--overwrite",
                 "--trace-format", "csv"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "run.json", "trace.csv"]
    assert json.loads((out / "run.json").read_text())["config"]["seed"] == 1


def _quick_experiment(name, number):
    def run(ctx):
        (ctx.out / f"{name}.png").write_bytes(b"png " + name.encode())
        return Result(name, f"The {name} experiment", {"value": number, "quick": ctx.quick},
                      [f"{name}.png"], f"What {name} shows.\n\nA second paragraph.",
                      table=f"| {name} |\n|---|")
    return run


@pytest.fixture
def two_experiments(monkeypatch):
    experiments.names()
    monkeypatch.setattr(experiments, "BROKEN", {})
    monkeypatch.setattr(experiments, "REGISTRY", {
        "alpha": Experiment("alpha", "The alpha experiment", _quick_experiment("alpha", 1)),
        "beta": Experiment("beta", "The beta experiment", _quick_experiment("beta", 2))})
    monkeypatch.setattr(experiments, "_module_names", lambda: [])


def test_reproduce_only_keeps_the_other_experiments_summaries(two_experiments, tmp_path):
    experiments.reproduce(tmp_path, quick=True)
    whole = {name: (tmp_path / name).read_text() for name in ("summary.md", "summary.json")}
    assert whole["summary.md"].count("\n## ") == 2
    experiments.reproduce(tmp_path, quick=True, only=["beta"])
    assert {name: (tmp_path / name).read_text() for name in whole} == whole
    with pytest.raises(ValueError, match="holds a quick run.*rerun them with --quick"):
        experiments.reproduce(tmp_path, only=["alpha"])           # would mix full and quick
    assert {name: (tmp_path / name).read_text() for name in whole} == whole
    (tmp_path / "summary.json").write_text("{" * 100_000)
    with pytest.raises(ValueError, match="summary.json does not read back"):
        experiments.reproduce(tmp_path, quick=True, only=["alpha"])


def test_a_closed_pipe_ends_quietly(tmp_path):
    done = subprocess.run(f"{sys.executable} -m fpsim formats | head -c 10", shell=True,
                          capture_output=True, text=True, env=ENV)
    assert done.stdout == "name      " and done.stderr == ""
    reader_gone = fpsim("formats")
    reader_gone.stdout.close()              # closed before fpsim writes: its print fails
    assert reader_gone.wait(timeout=60) == 141
    with reader_gone.stderr:
        assert reader_gone.stderr.read() == ""


def test_ctrl_c_that_surfaces_as_another_exception_still_stops_the_run(tmp_path, monkeypatch):
    """A Ctrl-C landing while pybind11 converts matplotlib's arguments comes out as a
    TypeError; reproduce must still stop as for Ctrl-C, not record a failed experiment."""
    import os

    from fpsim import experiments

    def interrupted_inside_cpp(ctx):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10 ** 6):       # the handler runs at the next bytecode boundary
                pass
        except KeyboardInterrupt:
            raise TypeError("incompatible function arguments") from None
        raise AssertionError("no Ctrl-C arrived")

    monkeypatch.setitem(experiments.REGISTRY, "underflow",
                        experiments.Experiment("underflow", "t", interrupted_inside_cpp))
    # Python's own handler, as an interactive run has it (a background job ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            experiments.reproduce(tmp_path / "out", quick=True, only=["underflow"])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not (tmp_path / "out" / "summary.json").exists()
