"""Sweep specs are checked whole before anything runs; cells, keys and outcomes (no Dask)."""
from __future__ import annotations

import math

import pytest

from fpsim.cli import main
from fpsim.sweep import SpecError, expand, parse_spec
from fpsim.sweep.cells import config_key
from fpsim.sweep.baseline import judge
from fpsim.sweep.results import TABLE_METRICS, read_table, summarize, write_tables
from fpsim.train import StepRecord

SPEC = """
[sweep]
name = "tiny"
[base]
data = "blobs"
samples = 128
hidden = "8"
steps = 5
[grid]
policy = ["16-mixed", "bf16-mixed"]
seed = [0, 1, 2]
[zip]
lr = [0.1, 0.01]
batch-size = [32, 16]
"""


def test_grid_and_zip_expand_in_file_order():
    spec = parse_spec(SPEC, "tiny.toml")
    cells = expand(spec)
    assert len(cells) == 2 * 3 * 2
    assert spec.axes == ["policy", "seed", "lr", "batch_size"]
    assert [c.axes for c in cells[:3]] == [
        {"policy": "16-mixed", "seed": 0, "lr": 0.1, "batch_size": 32},
        {"policy": "16-mixed", "seed": 0, "lr": 0.01, "batch_size": 16},
        {"policy": "16-mixed", "seed": 1, "lr": 0.1, "batch_size": 32}]
    first = cells[0].config
    assert first["data"] == "blobs" and first["optimizer"] == "sgd"   # fpsim train's default
    assert first["clip_norm"] is None and first["classes"] == 4
    assert len({c.key for c in cells}) == len(cells)
    assert [c.key for c in expand(parse_spec(SPEC, "again.toml"))] == [c.key for c in cells]


def test_key_covers_the_whole_configuration_and_the_version():
    config = expand(parse_spec(SPEC))[0].config
    assert config_key(config) != config_key(dict(config, momentum=0.5))
    assert config_key(config) != config_key(config, version="0.0.0")
    assert config_key(dict(reversed(list(config.items())))) == config_key(config)


@pytest.mark.parametrize("text,message", [
    ("[base]\nlearning_rate = 0.1\n[grid]\nseed = [0, 1]",
     "[base] has unknown field 'learning_rate'"),
    ("[grid]\npolicy = ['16-mixed', 'fp17-mixed']", "[grid] policy: unknown precision policy"),
    ("[grid]\nscaler = ['dynamic', 'nvidia']", "[grid] scaler: unknown scaler 'nvidia'"),
    ("[grid]\noptimizer = ['sgd', 'lion']", "unknown optimizer (--optimizer) 'lion'"),
    ("[grid]\nsteps = [5, 'ten']", "[grid] steps: must be an integer, got 'ten'"),
    ("[grid]\nlr = [0.1, 0]", "[grid] lr: lr (--lr) must be a number in (0.0, inf), got 0.0"),
    ("[grid]\nhidden = ['8', '8,x']", "hidden (--hidden) takes comma-separated positive integers"),
    ("[grid]\nseed = [0, 0]", "[grid] seed: 0 is listed twice"),
    ("[grid]\nseed = 3", "[grid] seed: an axis is a non-empty list of values"),
    ("[base]\nout = 'x'\n[grid]\nseed = [0, 1]", "'out' is set by the sweep itself"),
    ("[grid]\nbackend = ['numpy', 'torch']", "'backend' is set by the sweep itself"),
    ("[base]\nseed = 1\n[grid]\nseed = [0, 1]", "field 'seed' is in both [base] and [grid]"),
    ("[zip]\nlr = [0.1, 0.2]\nseed = [0]", "the lists in [zip] must have one length"),
    ("[base]\nsteps = 5", "nothing to vary"),
    ("[grids]\nseed = [0, 1]", "unknown table or key 'grids'"),
    ("[sweep]\nauthor = 'me'\n[grid]\nseed = [0, 1]", "[sweep] has no field 'author'"),
    ("[grid\nseed = [0, 1]", "not valid TOML"),
])
def test_bad_spec_names_the_problem(text, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "bad.toml")
    assert message in str(caught.value) and str(caught.value).startswith("bad.toml: ")


def test_cli_reports_one_line_exits_2_and_writes_nothing(tmp_path, capsys):
    spec = tmp_path / "bad.toml"
    spec.write_text("[base]\nsteps = 5\n[grid]\nactivation = ['relu', 'swish']\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fpsim: error: ")
    assert "[grid] activation: unknown activation (--activation) 'swish'" in err
    assert not out.exists()
    assert main(["sweep", str(tmp_path / "missing.toml"), "--out", str(out)]) == 2
    assert "missing.toml not found" in capsys.readouterr().err


def _records(losses, skipped=False):
    return [StepRecord(i, loss, 1.0, False, skipped, 1.0, 0.25, 0.5, 0.01)
            for i, loss in enumerate(losses)]


@pytest.mark.parametrize("losses,outcome,left", [
    ([1.4] * 5 + [0.5] * 20, "converged", 6),     # (5 * 1.4 + 2 * 0.5) / 7 < 0.9 ln 4
    ([1.4] * 25, "stalled", None),
    ([1.4] * 5 + [math.nan] * 3, "diverged", None),
    ([1.4] * 5 + [9.0] * 20, "diverged", None),
])
def test_outcomes(losses, outcome, left):
    row = summarize(3, "k", {"classes": 4, "lr": 0.1}, _records(losses), 65536.0, 1.5, None)
    assert (row["outcome"], row["plateau_left_step"], row["status"]) == (outcome, left, "ok")
    assert row["cell"] == 3 and row["lr"] == 0.1 and row["underflow_fraction"] == 0.25
    assert row["nan_step"] == (5 if outcome == "diverged" and math.isnan(losses[-1]) else None)


def test_a_failed_cell_keeps_its_error():
    row = summarize(0, "k", {"classes": 4}, [], None, 0.1, "ValueError: momentum")
    assert (row["status"], row["outcome"], row["error"]) == ("failed", "failed",
                                                              "ValueError: momentum")


def _rows():
    config = {"classes": 4, "lr": 0.1, "clip_norm": None}
    ok = summarize(1, "b", config, _records([1.4] * 5 + [0.5] * 20), 65536.0, 1.5, None)
    failed = summarize(0, "a", config, [], None, 0.1, "ValueError: no")
    return judge([ok, failed], {}), ["cell", "key", "lr", "clip_norm", *TABLE_METRICS]


def test_csv_table_is_exact_and_sorted_by_cell(tmp_path, monkeypatch):
    from fpsim.sweep import results

    monkeypatch.setattr(results, "parquet_available", lambda: False)
    rows, columns = _rows()
    assert write_tables(tmp_path, rows, columns) == [tmp_path / "results.csv"]
    table = read_table(tmp_path / "results.csv")
    assert [r["cell"] for r in table] == ["0", "1"]
    assert table[1]["final_loss"] == "0.5" and table[1]["final_loss_bits"] == "0x3f000000"
    assert table[0]["error"] == "ValueError: no" and table[0]["final_loss"] == ""
    assert float(table[1]["trailing_loss"]) == rows[0]["trailing_loss"]      # repr round-trips
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_parquet_table_when_pyarrow_is_installed(tmp_path):
    parquet = pytest.importorskip("pyarrow.parquet", reason="pyarrow writes results.parquet")
    rows, columns = _rows()
    write_tables(tmp_path, rows, columns)
    table = parquet.read_table(tmp_path / "results.parquet").to_pylist()
    assert [r["cell"] for r in table] == [0, 1]
    assert table[1]["final_loss"] == 0.5 and table[1]["plateau_left_step"] == 6
    assert table[0]["final_loss"] is None and table[0]["outcome"] == "failed"
