"""fpsim sweep keeps its folder safe: one sweep at a time (the folder lock), a stale lock
taken over with a note, a table on disk holding every finished cell even after kill -9, an
unwritable folder and absurd sizes refused before any worker starts, and every file it reads
back (sweep.json, result.json, results.csv) checked, with one line naming the file."""
from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fpsim.sweep.run as sweep_run
from fpsim.cli import main
from fpsim.files import LOCK_NAME
from test_sweep import SLOW   # cells of about a second each
from child_env import child_env

REPO = Path(__file__).resolve().parents[1]
TINY = """
[base]
data = "blobs"
samples = 128
hidden = "8"
steps = 5
[grid]
seed = [0, 1]
lr = [0.1, 0.2]
"""


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fpsim: error: "), captured.err
    return lines[0]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished 4-cell sweep (2 local workers): its spec and folder."""
    folder = tmp_path_factory.mktemp("swept")
    spec = folder / "spec.toml"
    spec.write_text(TINY)
    assert main(["sweep", str(spec), "--out", str(folder / "out"), "--workers", "2",
                 "--quiet"]) == 0
    return spec, folder / "out"


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if a Dask cluster would start."""
    def refuse(*args, **kwargs):
        raise AssertionError("a Dask cluster was started")

    monkeypatch.setattr(sweep_run, "local_cluster", refuse)


def test_a_folder_in_use_is_refused_naming_the_process(tmp_path, capsys, no_cluster):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live process
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"process {os.getpid()}" in line and LOCK_NAME in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]     # nothing written


def test_a_stale_lock_is_taken_over_with_a_note(swept, tmp_path, capsys):
    spec, finished = swept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (finished / LOCK_NAME).write_text(f"{dead} {socket.gethostname()}\n")
    assert main(["sweep", str(spec), "--out", str(finished), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "fpsim sweep: note: took over the stale lock" in err and f"process {dead}" in err
    assert not (finished / LOCK_NAME).exists()


def test_the_plan_is_printed_before_the_cells_run(swept, capsys):
    spec, finished = swept
    assert main(["sweep", str(spec), "--out", str(finished)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "sweep: 4 cells, 4 done earlier, 0 to run"


def test_an_unwritable_folder_is_refused_before_any_worker_starts(tmp_path, capsys,
                                                                  no_cluster):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["sweep", str(spec), "--out", str(blocker / "out")]) == 2
    assert "cannot write the output folder" in one_error_line(capsys)


class _Cluster:
    """A stand-in for ``distributed.Client`` connected to a cluster whose one worker runs
    another fpsim (``reachable=False``: a scheduler that does not answer)."""

    reachable = True

    def __init__(self, address, timeout):
        if not self.reachable:
            raise OSError(f"Timed out trying to connect to {address} after {timeout}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, function):
        return {"tcp://10.0.0.2:40001": "0.0.1-other"}


@pytest.mark.parametrize("reachable", [True, False])
def test_a_cluster_that_cannot_run_the_sweep_is_refused_before_the_folder_is_made(
        tmp_path, capsys, monkeypatch, no_cluster, reachable):
    import distributed

    monkeypatch.setattr(_Cluster, "reachable", reachable)
    monkeypatch.setattr(distributed, "Client", _Cluster)
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--scheduler", "tcp://sched:8786"]) == 2
    line = one_error_line(capsys)
    assert ("runs fpsim 0.0.1-other" if reachable else "cannot reach the Dask scheduler") in line
    assert not out.exists()


def test_absurd_worker_counts_and_grids_are_refused(tmp_path, capsys, no_cluster):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "a"), "--workers", "100000"]) == 2
    assert "--workers must be an integer from 1 to" in one_error_line(capsys)
    axes = "\n".join(f"{name} = {list(range(1, 11))}" for name in
                     ("seed", "steps", "samples", "features", "batch_size"))
    huge = tmp_path / "huge.toml"
    huge.write_text(f"[grid]\n{axes}\nclasses = {list(range(2, 12))}\n")
    began = time.perf_counter()
    assert main(["sweep", str(huge), "--out", str(tmp_path / "b")]) == 2
    assert "1,000,000 cells, more than the 100,000" in one_error_line(capsys)
    assert time.perf_counter() - began < 5      # counted, not expanded
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("address", ["garbage", "tcp://garbage", "localhost:port",
                                     "http://host:8786", "host:70000", "tcp://:8786"])
def test_a_scheduler_address_of_the_wrong_form_is_refused_before_any_work(tmp_path, capsys,
                                                                          no_cluster, address):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY)
    began = time.perf_counter()
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--scheduler",
                 address]) == 2
    line = one_error_line(capsys)
    assert f"--scheduler {address!r} is not a Dask scheduler address: give HOST:PORT or " \
           f"PROTOCOL://HOST:PORT (tcp, tls" in line and "leave --scheduler out" in line
    assert time.perf_counter() - began < 5      # no wait for a connection
    assert not (tmp_path / "out").exists()


def test_workers_started_never_outnumber_the_cells(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY.replace("lr = [0.1, 0.2]", ""))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 to run on 2 local worker process(es)" in out and "on 2 worker(s)" in out


SHAPES = {"a list": "[1, 2]", "a string": '"sweep"', "null": "null",
          "spec a list": '{"format": "fpsim-sweep", "version": 1, "fpsim": "x", "spec": [], '
                    '"cells": []}',
          "missing keys": '{"format": "fpsim-sweep", "spec": {}}',
          "not JSON": '{"format": ',
          "a bad axis": '{"format": "fpsim-sweep", "version": 1, "fpsim": "x", "cells": [], '
                        '"spec": {"name": "n", "description": "", "base": {}, "zip": {}, '
                        '"grid": {"seed": 3}}}'}


@pytest.mark.parametrize("command", ["sweep", "sweep-plot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_malformed_sweep_json_gives_one_line_naming_it(swept, tmp_path, capsys, command,
                                                          shape, no_cluster):
    spec, finished = swept
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "sweep.json").write_text(SHAPES[shape])
    (copy / "results.csv").write_text((finished / "results.csv").read_text())
    argv = (["sweep", str(spec), "--out", str(copy)] if command == "sweep"
            else ["sweep-plot", str(copy), "--x", "seed", "--y", "lr"])
    assert main(argv) == 2
    assert str(copy / "sweep.json") in one_error_line(capsys)


@pytest.mark.parametrize("damage", ["list", "wrong key", "missing column", "text loss",
                                    "other config", "NaN literal"])
def test_a_malformed_cell_result_gives_one_line_naming_it(swept, tmp_path, capsys, damage,
                                                           no_cluster):
    spec, finished = swept
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(copy)], check=True)
    result = next((copy / "cells").glob("*/result.json"))
    row = json.loads(result.read_text())
    if damage == "list":
        row = [row]
    elif damage == "wrong key":
        row["key"] = "0" * 16
    elif damage == "missing column":
        del row["outcome"]
    elif damage == "text loss":
        row["final_loss"] = "low"
    elif damage == "NaN literal":       # not JSON; result.json spells it "nan"
        row["final_loss"] = float("nan")
    else:
        row["lr"] = 7.0
    result.write_text(json.dumps(row))
    assert main(["sweep", str(spec), "--out", str(copy)]) == 2
    line = one_error_line(capsys)
    assert str(result) in line and f"delete {result.parent} to run that cell again" in line


@pytest.mark.parametrize("damage", ["torn last row", "extra field", "unknown outcome",
                                    "no header", "text number", "unknown judge"])
def test_sweep_plot_refuses_a_damaged_table_naming_the_row(swept, tmp_path, capsys, damage):
    _, finished = swept
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "sweep.json").write_text((finished / "sweep.json").read_text())
    lines = (finished / "results.csv").read_text().splitlines(keepends=True)
    if damage == "torn last row":
        lines[-1] = lines[-1][:-9]
    elif damage == "extra field":
        lines[2] = lines[2].rstrip("\n") + ",more\n"
    elif damage == "unknown outcome":
        lines[2] = lines[2].replace("converged", "great")
    elif damage == "no header":
        lines = lines[1:]
    elif damage == "unknown judge":
        assert lines[2].count(",absolute,") == 1
        lines[2] = lines[2].replace(",absolute,", ",vibes,")
    else:
        header = lines[0].rstrip("\n").split(",")
        fields = next(csv.reader([lines[2]]))
        fields[header.index("final_loss")] = "low"
        lines[2] = ",".join(fields) + "\n"
    (copy / "results.csv").write_text("".join(lines))
    argv = ["sweep-plot", str(copy), "--x", "seed", "--y", "lr", "--out", str(tmp_path / "p")]
    if damage == "text number":
        argv += ["--outcome", "final_loss"]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert str(copy / "results.csv") in line
    if damage != "no header":
        assert " line 5" in line if damage == "torn last row" else " line 3" in line
    assert not list(tmp_path.glob("p*"))


def test_kill_9_of_the_driver_leaves_every_finished_cell_in_the_table(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SLOW)
    out = tmp_path / "out"
    env = child_env()
    process = subprocess.Popen([sys.executable, "-m", "fpsim", "sweep", str(spec), "--out",
                                str(out), "--workers", "1", "--quiet"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any((out / "cells").glob("*/result.json")):
            time.sleep(0.02)
        time.sleep(0.2)     # well within the next cell (about a second)
    finally:
        os.killpg(process.pid, signal.SIGKILL)     # the driver and its Dask workers
        process.wait(timeout=30)
    finished = {p.parent.name for p in (out / "cells").glob("*/result.json")}
    assert finished
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["key"] for row in rows} == finished
    assert (out / LOCK_NAME).exists()       # left behind: the next run takes it over, noted


def test_seeds_that_disagree_are_drawn_mixed_with_their_counts(tmp_path, monkeypatch):
    from fpsim.sweep import phase_diagram
    from fpsim.sweep.record import SWEEP_FORMAT
    from fpsim.sweep.baseline import judge
    from fpsim.sweep.results import HEAD, METRICS, TABLE_METRICS, write_tables
    import fpsim.plots.phase as plots_phase

    spec = {"name": "ties", "description": "", "base": {},
            "grid": {"lr": [0.1], "policy": ["16-mixed", "bf16-mixed"], "seed": [0, 1]},
            "zip": {}}
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"format": SWEEP_FORMAT, "version": 1, "fpsim": "x", "spec": spec, "cells": []}))
    # seed 0 and 1 of 16-mixed end at 1.2402 and 1.2500: either side of the threshold
    ends = [("16-mixed", 0, "converged"), ("16-mixed", 1, "stalled"),
            ("bf16-mixed", 0, "converged"), ("bf16-mixed", 1, "converged")]
    rows = [dict({name: None for name in METRICS}, cell=i, key=f"k{i}", lr=0.1, policy=policy,
                 seed=seed, status="ok", outcome=outcome)
            for i, (policy, seed, outcome) in enumerate(ends)]
    write_tables(tmp_path, judge(rows, {}), [*HEAD, "lr", "policy", "seed", *TABLE_METRICS])
    drawn = {}
    monkeypatch.setattr(plots_phase, "plot_phase_diagram",
                        lambda panels, **kwargs: drawn.update(panels) or [])
    phase_diagram(tmp_path, "policy", "lr")
    (grid,) = drawn.values()
    assert grid == [[("mixed", {"converged": 1, "stalled": 1}, 2), ("converged", {}, 2)]]
