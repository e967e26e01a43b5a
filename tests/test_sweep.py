"""fpsim sweep on real Dask clusters: 2 local worker processes, the same bits with 1 or 2
workers, resume, a worker killed mid-cell, an interrupted sweep, failing cells."""
from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from child_process import ctrl_c_reaches_python

from fpsim.cli import main
from fpsim.sweep import load_spec, read_table, run_sweep
from fpsim.sweep.run import local_cluster
from child_env import child_env

REPO = Path(__file__).resolve().parents[1]
TINY = """
[sweep]
name = "tiny"
[base]
data = "blobs"
samples = 128
hidden = "8"
steps = 5
[grid]
policy = ["16-mixed", "bf16-mixed"]
seed = [0, 1]
"""
# Cells of about a second each: long enough to kill a worker, or interrupt, mid-cell.
SLOW = """
[base]
data = "teacher"
samples = 256
hidden = "32,32"
steps = 40
[grid]
seed = [0, 1, 2, 3]
"""


def _table(folder: Path) -> list[dict]:
    """results.csv without the wall-time column (the one that differs between runs)."""
    with open(folder / "results.csv", newline="") as handle:
        return [{k: v for k, v in row.items() if k != "wall_time"}
                for row in csv.DictReader(handle)]


def _spec(tmp_path: Path, text: str, name: str = "spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2) as running:
        yield running


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    """The tiny sweep through the command line on a local cluster of 2 worker processes."""
    folder = tmp_path_factory.mktemp("sweep2")
    spec = _spec(folder, TINY)
    out = folder / "out"
    started = time.perf_counter()
    status = main(["sweep", str(spec), "--out", str(out), "--workers", "2"])
    return spec, out, status, time.perf_counter() - started


def test_two_local_workers_write_table_cells_and_sweep_json(two_worker_run, capsys):
    _, out, status, _ = two_worker_run
    assert status == 0
    rows = _table(out)
    assert [r["cell"] for r in rows] == ["0", "1", "2", "3"]
    assert {r["status"] for r in rows} == {"ok"} and all(r["final_loss_bits"] for r in rows)
    assert [(r["policy"], r["seed"]) for r in rows] == [
        ("16-mixed", "0"), ("16-mixed", "1"), ("bf16-mixed", "0"), ("bf16-mixed", "1")]
    info = json.loads((out / "sweep.json").read_text())
    assert info["spec"]["grid"] == {"policy": ["16-mixed", "bf16-mixed"], "seed": [0, 1]}
    assert [c["key"] for c in info["cells"]] == [r["key"] for r in rows]
    for row in rows:
        folder = out / "cells" / row["key"]
        assert {p.name for p in folder.iterdir()} == {"result.json", "run.json", "trace.jsonl"}
        assert len((folder / "trace.jsonl").read_text().splitlines()) == 5


def test_a_cell_is_exactly_fpsim_train(two_worker_run, tmp_path, capsys):
    _, out, _, _ = two_worker_run
    row = _table(out)[3]
    assert main(["train", "--data", "blobs", "--samples", "128", "--hidden", "8", "--steps", "5",
                 "--policy", "bf16-mixed", "--seed", "1", "--out", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert f"loss sha256 {row['loss_sha256'][:16]}" in printed
    assert (tmp_path / "run" / "trace.jsonl").read_text().count(row["final_loss_bits"]) == 1


def test_one_worker_gives_the_same_table_and_rerun_skips_done_cells(two_worker_run, cluster,
                                                                    tmp_path):
    spec, out2, *_ = two_worker_run
    out1 = tmp_path / "one"
    summary = run_sweep(load_spec(spec), out1, workers=1, progress=False)
    assert (summary.cells, summary.earlier, summary.workers) == (4, 0, 1)
    assert _table(out1) == _table(out2)
    # resume: a rerun finds every cell done; a lost cell result is run again, same bits
    (out1 / "cells" / _table(out1)[2]["key"] / "result.json").unlink()
    again = run_sweep(load_spec(spec), out1, scheduler=cluster.scheduler_address,
                      progress=False)
    assert (again.earlier, again.outcomes) == (3, summary.outcomes)
    assert _table(out1) == _table(out2)
    done = run_sweep(load_spec(spec), out1, workers=1, progress=False)   # starts no cluster
    assert (done.earlier, done.workers) == (4, 0) and "nothing to run" in done.line()
    assert _table(out1) == _table(out2)


def test_an_existing_different_sweep_is_not_replaced(two_worker_run, tmp_path, capsys):
    _, out, _, _ = two_worker_run
    other = _spec(tmp_path, TINY.replace("steps = 5", "steps = 6"))
    before = (out / "results.csv").read_bytes()
    assert main(["sweep", str(other), "--out", str(out)]) == 2
    assert "holds a different sweep" in capsys.readouterr().err
    assert (out / "results.csv").read_bytes() == before


def test_a_sweep_on_torch_gives_numpys_table_and_keeps_to_its_backend(two_worker_run, cluster,
                                                                       tmp_path, capsys):
    pytest.importorskip("torch", reason="the torch backend needs PyTorch (fpsim[torch])")
    spec, out_numpy, *_ = two_worker_run
    out = tmp_path / "torch"
    summary = run_sweep(load_spec(spec), out, scheduler=cluster.scheduler_address,
                        progress=False, backend_name="torch")
    assert summary.cells == 4 and _table(out) == _table(out_numpy)
    assert json.loads((out / "sweep.json").read_text())["backend"] == "torch"
    assert json.loads((out_numpy / "sweep.json").read_text())["backend"] == "numpy"
    key = _table(out)[0]["key"]
    assert json.loads((out / "cells" / key / "run.json").read_text())["backend"] == "torch"
    before = (out / "results.csv").read_bytes()
    assert main(["sweep", str(spec), "--out", str(out), "--backend", "numpy"]) == 2
    assert "was swept on the torch backend" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--out", str(tmp_path / "new"), "--backend", "cupy"]) == 2
    assert "unknown backend 'cupy'" in capsys.readouterr().err
    assert (out / "results.csv").read_bytes() == before and not (tmp_path / "new").exists()


def test_a_sweep_over_a_cnns_arguments_on_images(cluster, tmp_path):
    spec = _spec(tmp_path, '[base]\nmodel = "cnn"\ndata = "images"\ndata_arg = ["size=8"]\n'
                           'samples = 64\nsteps = 3\nbatch_size = 8\n[grid]\n'
                           'model_arg = [["channels=[2]"], ["channels=[2, 4]"]]\n')
    summary = run_sweep(load_spec(spec), tmp_path / "out", scheduler=cluster.scheduler_address,
                        progress=False)
    rows = _table(tmp_path / "out")
    assert summary.cells == 2 and [r["status"] for r in rows] == ["ok", "ok"]
    assert rows[0]["loss_sha256"] != rows[1]["loss_sha256"]


def test_failing_cells_are_recorded_and_the_sweep_goes_on(cluster, tmp_path):
    spec = _spec(tmp_path, TINY.replace('seed = [0, 1]', 'optimizer = ["sgd", "adam"]\n'
                                        'lr = [0.1, 1e6]').replace("steps = 5", "steps = 5\n"
                                                                    "momentum = 0.5"))
    summary = run_sweep(load_spec(spec), tmp_path / "out", scheduler=cluster.scheduler_address,
                        progress=False)
    rows = _table(tmp_path / "out")
    assert len(rows) == 8 and not summary.not_run
    adam = [r for r in rows if r["optimizer"] == "adam"]
    assert {r["outcome"] for r in adam} == {"failed"}
    assert all("momentum" in r["error"] and not r["final_loss"] for r in adam)
    sgd = {(r["policy"], r["lr"]): r for r in rows if r["optimizer"] == "sgd"}
    assert sgd["16-mixed", "1000000.0"]["outcome"] == "diverged"
    assert sgd["16-mixed", "1000000.0"]["nan_step"] != ""
    assert sgd["16-mixed", "0.1"]["outcome"] == "converged"
    # a NaN result is written as the string JSON allows and read back: a rerun of the folder
    # (to resume, or to rewrite the table) reads every cell, the diverged ones included
    nan_cell = sgd["16-mixed", "1000000.0"]["key"]
    assert '"final_loss": "nan"' in (tmp_path / "out" / "cells" / nan_cell / "result.json"
                                     ).read_text()
    again = run_sweep(load_spec(spec), tmp_path / "out", progress=False)
    assert (again.earlier, again.outcomes) == (8, summary.outcomes)
    assert _table(tmp_path / "out") == rows


def test_the_table_judges_each_cell_against_its_fp32_cell(cluster, tmp_path):
    spec = _spec(tmp_path, TINY.replace('"16-mixed", "bf16-mixed"', '"32-true", "16-mixed"'))
    out = tmp_path / "out"
    summary = run_sweep(load_spec(spec), out, scheduler=cluster.scheduler_address,
                        progress=False)
    rows = read_table(out / "results.csv")
    fp32 = {row["seed"]: row for row in rows if row["policy"] == "32-true"}
    assert [(r["judged_by"], r["baseline_cell"], r["outcome"]) for r in fp32.values()] == [
        ("absolute", "", "converged")] * 2          # the references: fixed thresholds
    plateau = math.log(4)
    for row in rows[2:]:
        reference = fp32[row["seed"]]
        assert (row["policy"], row["judged_by"], row["baseline_cell"]) == (
            "16-mixed", "baseline", reference["cell"])
        assert row["baseline_trailing_loss"] == reference["trailing_loss"]
        trailing, baseline = float(row["trailing_loss"]), float(reference["trailing_loss"])
        assert row["outcome"] == ("converged" if trailing - baseline <= plateau - trailing
                                  else "stalled")
        # the cell's own row keeps what the fixed thresholds say
        own = json.loads((out / "cells" / row["key"] / "result.json").read_text())
        assert own["outcome"] == ("converged" if trailing < 0.9 * plateau else "stalled")
        assert "judged_by" not in own
    assert summary.outcomes == {outcome: sum(r["outcome"] == outcome for r in rows)
                                for outcome in {r["outcome"] for r in rows}}


def _kill_a_busy_worker(cluster, killed: list):
    """Wait until a worker is processing a cell, then SIGKILL that worker's process (its nanny
    starts a new one; the scheduler gives the cell to a worker again)."""
    from distributed import Client

    with Client(cluster.scheduler_address) as client:
        pids = client.run(os.getpid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = [addr for addr, keys in client.processing().items()
                    if any(str(k).startswith("fpsim-cell-") for k in keys)]
            if busy:
                time.sleep(0.1)
                os.kill(pids[busy[0]], signal.SIGKILL)
                killed.append(pids[busy[0]])
                return
            time.sleep(0.02)


def test_a_worker_killed_mid_cell_is_retried_and_the_sweep_completes(cluster, tmp_path):
    spec = load_spec(_spec(tmp_path, SLOW))
    killed: list = []
    killer = threading.Thread(target=_kill_a_busy_worker, args=(cluster, killed))
    killer.start()
    summary = run_sweep(spec, tmp_path / "killed", scheduler=cluster.scheduler_address,
                        progress=False)
    killer.join()
    assert killed, "no worker was seen running a cell"
    assert not summary.not_run and summary.earlier == 0
    reference = run_sweep(spec, tmp_path / "calm", scheduler=cluster.scheduler_address,
                          progress=False)
    assert not reference.not_run
    assert _table(tmp_path / "killed") == _table(tmp_path / "calm")
    assert len(_table(tmp_path / "calm")) == 4


def test_an_interrupted_sweep_keeps_complete_rows_and_resumes(cluster, tmp_path):
    spec = _spec(tmp_path, SLOW)
    out = tmp_path / "out"
    env = child_env()
    process = subprocess.Popen([sys.executable, "-m", "fpsim", "sweep", str(spec), "--out",
                                str(out), "--workers", "1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_reaches_python)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any((out / "cells").glob("*/result.json")):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "rerun the same command to resume" in stdout
    rows = _table(out)
    assert 1 <= len(rows) < 4
    assert all(r["status"] == "ok" and r["loss_sha256"] for r in rows)
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]   # no temporaries left
    assert main(["sweep", str(spec), "--out", str(out), "--scheduler", cluster.scheduler_address,
                 "--quiet"]) == 0
    finished = _table(out)
    assert len(finished) == 4 and finished[:len(rows)] == rows


def test_phase_diagrams_of_outcomes_and_numbers(two_worker_run, tmp_path, capsys):
    _, out, _, _ = two_worker_run
    stem = tmp_path / "phase"
    assert main(["sweep-plot", str(out), "--x", "seed", "--y", "policy", "--out", str(stem)]) == 0
    first = (tmp_path / "phase.png").read_bytes()
    assert first.startswith(b"\x89PNG") and (tmp_path / "phase.svg").exists()
    assert main(["sweep-plot", str(out), "--x", "seed", "--y", "policy", "--out",
                 str(stem)]) == 0
    assert (tmp_path / "phase.png").read_bytes() == first          # same numbers, same bytes
    assert main(["sweep-plot", str(out), "--x", "seed", "--y", "policy",
                 "--outcome", "final_loss"]) == 0
    assert (out / "phase_final_loss.svg").exists()
    capsys.readouterr()
    for argv, message in [(["--x", "lr", "--y", "policy"], "--x 'lr' is not an axis of this "
                                                            "sweep; its axes: policy, seed"),
                          (["--x", "seed", "--y", "seed"], "must be different axes"),
                          (["--x", "seed", "--y", "policy", "--outcome", "speed"],
                           "unknown outcome 'speed'")]:
        assert main(["sweep-plot", str(out), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("fpsim: error: ") and message in err


def test_a_cell_that_cannot_run_is_retried_named_and_left_for_the_next_run(cluster, tmp_path,
                                                                           capsys):
    # 10**13 samples cannot be allocated here: a MemoryError depends on the machine, so it is
    # not the cell's result (retried by Dask, then reported, and tried again on a rerun).
    spec = _spec(tmp_path, TINY.replace("seed = [0, 1]", "samples = [128, 10000000000000]")
                 .replace("samples = 128\n", ""))
    out = tmp_path / "out"
    argv = ["sweep", str(spec), "--out", str(out), "--scheduler", cluster.scheduler_address]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "sweep: 2 of 4 cells" in printed and "2 cell(s) could not run" in printed
    assert "MemoryError" in printed
    assert [r["samples"] for r in _table(out)] == ["128", "128"]
    assert main(argv) == 1
    assert "2 from earlier runs" in capsys.readouterr().out
