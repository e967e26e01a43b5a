"""Nothing lost when a run is replaced: ``--overwrite`` keeps the old run until the new one is
complete (a full disk, an error or Ctrl-C leave it byte for byte), an OS error names the file
and says what was kept, and what a killed run leaves behind (atomic writers' temporaries, a
half-done swap) is settled by the next run in the folder, touching no other file."""
from __future__ import annotations

import errno
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fpsim import experiments
from fpsim.cli import main
from fpsim.experiments import Experiment, Result
from fpsim.train import trace as trace_module
from fpsim.train.run_folder import tidy_run_folder
from child_env import child_env

SMALL = ["--samples", "128", "--features", "4", "--hidden", "8", "--batch-size", "8"]
TRAIN = ["train", *SMALL, "--quiet"]
OLD_FILES = "run.json, trace.jsonl, checkpoint.npz"


def files_of(folder: Path) -> dict:
    """Every entry of ``folder`` (hidden ones included) with its bytes."""
    return {p.name: p.read_bytes() if p.is_file() else "folder" for p in folder.iterdir()}


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    assert main([*TRAIN, "--steps", "4", "--out", str(out)]) == 0
    return out, files_of(out)


class DiskFullAfter:
    """``os`` as the trace writer sees it, but ``write`` fails once ``allowed`` writes are
    done, as a full disk's does: an error that names no file."""

    def __init__(self, allowed: int, error: BaseException):
        self.allowed, self.error = allowed, error

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.allowed == 0:
            raise self.error
        self.allowed -= 1
        return os.write(fd, data)


def test_a_full_disk_during_overwrite_keeps_the_old_run_and_says_so(finished_run, capsys,
                                                                    monkeypatch):
    out, before = finished_run
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(trace_module, "os", DiskFullAfter(3, full))
    assert main([*TRAIN, "--steps", "20", "--seed", "1", "--out", str(out), "--overwrite"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"fpsim: error: the new run could not be written (trace.jsonl: "
        f"{os.strerror(errno.ENOSPC)}); nothing was replaced: {out} keeps its previous run "
        f"({OLD_FILES}) and the unfinished new run was removed"]
    assert captured.out == ""
    assert files_of(out) == before          # byte-identical, no hidden folder left


def test_ctrl_c_during_overwrite_keeps_the_old_run(finished_run, monkeypatch):
    out, before = finished_run
    monkeypatch.setattr(trace_module, "os", DiskFullAfter(2, KeyboardInterrupt()))
    assert main([*TRAIN, "--steps", "20", "--seed", "1", "--out", str(out), "--overwrite"]) == 130
    assert files_of(out) == before


def limit_file_size():
    """``preexec_fn``: files of at most 3000 bytes, as ``ulimit -f`` sets (Python ignores
    SIGXFSZ, so a write past it fails with EFBIG instead of killing the process)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="POSIX file size limit")
def test_overwrite_past_the_file_size_limit_keeps_the_old_run(finished_run):
    out, before = finished_run
    done = subprocess.run([sys.executable, "-m", "fpsim", *TRAIN, "--steps", "200", "--seed",
                           "1", "--out", str(out), "--overwrite"], capture_output=True,
                          text=True, env=child_env(), preexec_fn=limit_file_size, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(
        rf"fpsim: error: the new run could not be written \((run\.json|trace\.jsonl|"
        rf"checkpoint\.npz): {os.strerror(errno.EFBIG)}\); nothing was replaced: "
        rf"{re.escape(str(out))} keeps its previous run \({OLD_FILES}\) and the unfinished "
        rf"new run was removed\n", done.stderr), done.stderr
    assert files_of(out) == before


def test_a_complete_overwrite_replaces_every_old_file(finished_run):
    out, _ = finished_run
    assert main([*TRAIN, "--steps", "3", "--out", str(out), "--overwrite", "--per-layer"]) == 0
    assert sorted(files_of(out)) == ["checkpoint.npz", "layers.jsonl", "run.json",
                                     "trace.jsonl"]
    assert main([*TRAIN, "--steps", "3", "--out", str(out), "--overwrite"]) == 0
    assert sorted(files_of(out)) == ["checkpoint.npz", "run.json", "trace.jsonl"]


def test_a_killed_writers_temporaries_are_removed_and_no_other_file(finished_run, capsys):
    out, before = finished_run
    ours = [".checkpoint.npz.0123456789ab.tmp", ".run.json.abcdef012345.tmp"]
    theirs = ["notes.tmp", ".notes.tmp", ".data.0123456789ab.tmp.bak", ".x.0123456789AB.tmp",
              "checkpoint.npz.0123456789ab.tmp"]
    for name in ours + theirs:
        (out / name).write_bytes(b"half")
    (out / ".folder.0123456789ab.tmp").mkdir()     # a folder is never ours to delete
    assert main([*TRAIN, "--steps", "6", "--out", str(out), "--resume",
                 str(out / "checkpoint.npz")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"fpsim train: note: removed 2 temporary file(s) in {out} left by a write that was "
        f"killed ({', '.join(sorted(ours))})"]
    left = files_of(out)
    assert not any(name in left for name in ours)
    assert all(left[name] == b"half" for name in theirs) and ".folder.0123456789ab.tmp" in left
    assert left["trace.jsonl"].startswith(before["trace.jsonl"])


def test_a_killed_checkpoint_write_leaves_nothing_after_the_next_run(tmp_path):
    out = tmp_path / "run"
    victim = subprocess.Popen([sys.executable, "-m", "fpsim", *TRAIN, "--steps", "100000",
                               "--checkpoint-every", "1", "--out", str(out)], env=child_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        caught = _wait_for_temporary(out, victim)
    finally:
        victim.kill()
        victim.wait()
    if not caught:      # the kill landed between writes: leave such a temporary by hand
        (out / ".checkpoint.npz.0123456789ab.tmp").write_bytes(b"half")
    assert any(p.name.endswith(".tmp") for p in out.iterdir())
    assert main([*TRAIN, "--steps", "3", "--out", str(out), "--overwrite"]) == 0
    assert sorted(files_of(out)) == ["checkpoint.npz", "run.json", "trace.jsonl"]


def _wait_for_temporary(out: Path, victim, timeout: float = 60.0) -> bool:
    """Kill ``victim`` as soon as a checkpoint's temporary shows; whether one was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and victim.poll() is None:
        if out.is_dir() and any(p.name.startswith(".checkpoint.npz.") for p in out.iterdir()):
            victim.kill()
            return True
        time.sleep(0.0005)
    return False


def swap_stopped(out: Path, moved_aside: list, new_folder: str) -> tuple:
    """``out`` as a replacement killed mid-swap leaves it: ``moved_aside`` of the old run's
    files in ``.fpsim-old-T``, the new run's in ``new_folder`` + T."""
    token = "0123456789ab"
    aside, new = out / f".fpsim-old-{token}", out / f"{new_folder}{token}"
    aside.mkdir()
    new.mkdir()
    for name in moved_aside:
        os.replace(out / name, aside / name)
    (new / "run.json").write_text("new run\n")
    (new / "trace.jsonl").write_text("new trace\n")
    return aside, new


def test_a_swap_killed_while_the_old_run_moved_aside_is_undone(finished_run):
    out, before = finished_run
    swap_stopped(out, ["run.json", "trace.jsonl"], ".fpsim-new-")
    notes = tidy_run_folder(out)
    assert len(notes) == 1 and "the old run is restored" in notes[0]
    assert files_of(out) == before


def test_a_swap_killed_while_the_new_run_moved_in_is_completed(finished_run):
    out, _ = finished_run
    _, new = swap_stopped(out, ["run.json", "trace.jsonl", "checkpoint.npz"], ".fpsim-in-")
    os.replace(new / "run.json", out / "run.json")          # one file had moved in
    notes = tidy_run_folder(out)
    assert len(notes) == 1 and "completed the replacement" in notes[0]
    assert files_of(out) == {"run.json": b"new run\n", "trace.jsonl": b"new trace\n"}


def test_an_unfinished_replacement_left_by_kill_9_is_deleted(finished_run):
    out, before = finished_run
    (out / ".fpsim-new-0123456789ab").mkdir()
    (out / ".fpsim-new-0123456789ab" / "trace.jsonl").write_text("half\n")
    notes = tidy_run_folder(out)
    assert notes == [f"deleted {out / '.fpsim-new-0123456789ab'}, an unfinished run that was "
                     f"to replace the one there (it was stopped)"]
    assert files_of(out) == before


def _figure_experiment(name, fails_in_quick=False):
    def run(ctx):
        if fails_in_quick and ctx.quick:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(ctx.out / f"{name}.png"))
        (ctx.out / f"{name}.png").write_bytes(f"{name} {'quick' if ctx.quick else 'full'}".encode())
        return Result(name, f"The {name} experiment", {"quick": ctx.quick}, [f"{name}.png"],
                      f"What {name} shows.")
    return run


@pytest.fixture
def full_figures(tmp_path, monkeypatch):
    """A finished full run of two stand-in experiments (beta fails when run quick), and a
    file of the user's beside it."""
    experiments.names()
    monkeypatch.setattr(experiments, "BROKEN", {})
    monkeypatch.setattr(experiments, "_module_names", lambda: [])
    monkeypatch.setattr(experiments, "REGISTRY", {
        "alpha": Experiment("alpha", "The alpha experiment", _figure_experiment("alpha")),
        "beta": Experiment("beta", "The beta experiment", _figure_experiment("beta", True))})
    out = tmp_path / "figures"
    experiments.reproduce(out)
    (out / "notes.txt").write_text("mine\n")
    return out, files_of(out)


def test_a_failed_reproduce_overwrite_keeps_the_old_figures(full_figures, capsys):
    out, before = full_figures
    assert main(["reproduce", "--quick", "--overwrite", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fpsim reproduce: 1 experiment(s) failed (the other 1 ran but "
                          f"nothing was replaced: {out} keeps its previous run):\n  beta: ")
    assert files_of(out) == before


def test_a_full_disk_while_reproduce_overwrites_keeps_the_old_figures(full_figures, capsys,
                                                                      monkeypatch):
    out, before = full_figures
    experiments.REGISTRY.pop("beta")

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(experiments, "write_text", disk_full)
    assert main(["reproduce", "--quick", "--overwrite", "--out", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fpsim: error: the new run could not be written (summary.json: "
        f"{os.strerror(errno.ENOSPC)}); nothing was replaced: {out} keeps its previous run "
        f"and the unfinished new run was removed"]
    assert files_of(out) == before


def test_a_complete_reproduce_overwrite_replaces_what_it_rewrites(full_figures):
    out, before = full_figures
    experiments.REGISTRY.pop("beta")
    experiments.reproduce(out, quick=True, overwrite=True)
    after = files_of(out)
    assert sorted(after) == sorted(before)          # no hidden folder left, nothing lost
    assert after["alpha.png"] == b"alpha quick" and after["notes.txt"] == b"mine\n"
    assert after["beta.png"] == before["beta.png"]   # not rerun: left as it was
    assert '"mode": "quick"' in after["summary.json"].decode()
