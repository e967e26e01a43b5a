"""Sweep outcomes judged against each cell's fp32 baseline where the sweep has one (no Dask):
which cell is the baseline, the rule, the fixed thresholds where there is none, and the
table's judgement columns checked on read-back."""
from __future__ import annotations

import math

import pytest

from fpsim.sweep import expand, parse_spec
from fpsim.sweep.baseline import find_baselines, judge
from fpsim.sweep.results import (CONVERGED, HEAD, JUDGEMENT, TABLE_METRICS, read_table,
                                 summarize, write_tables)
from fpsim.train import StepRecord

PLATEAU = math.log(4)        # 4 classes: 1.3863; fixed threshold 0.9 L = 1.2477


def _baselines(text: str) -> tuple[dict, list]:
    cells = expand(parse_spec(text))
    return find_baselines({cell.index: cell.config for cell in cells}), cells


def test_the_baseline_is_the_fp32_cell_of_the_same_problem_and_seed():
    baselines, cells = _baselines("""
[grid]
policy = ["32-true", "16-mixed", "bf16-mixed"]
scaler = ["none", "static:4"]
seed = [0, 1]
lr = [0.1, 1.0]
""")
    assert len(baselines) == 16          # every cell but the 8 fp32 ones
    for index, reference in baselines.items():
        cell, base = cells[index].config, cells[reference].config
        assert base["policy"] == "32-true" and cell["policy"] != "32-true"
        # the same problem, and the fp32 run with the cell's own loss scale
        assert {k: v for k, v in cell.items() if k != "policy"} == \
               {k: v for k, v in base.items() if k != "policy"}


def test_recipes_paired_in_zip_and_master_formats_find_their_fp32_cell():
    baselines, _ = _baselines("""
[zip]
policy = ["32", "16-mixed", "bf16-true", "64-true"]
master = ["FP32", "bf16", "none", "float32"]
scaler = ["none", "dynamic", "static:2", "static:8"]
""")
    assert baselines == {1: 0, 2: 0, 3: 0}       # "32" and "FP32" are read as fpsim reads them
    baselines, cells = _baselines("""
[base]
policy = "32-true"
[grid]
master = ["bf16", "fp32", "none", "fp16"]
""")
    # fp32 weights under 32-true, unset or "none", are references; bf16 and fp16 masters are
    # judged against the first of them
    assert baselines == {0: 1, 3: 1}


@pytest.mark.parametrize("text", [
    "[grid]\npolicy = ['16-mixed', 'bf16-mixed']\nseed = [0, 1]\n",
    "[base]\npolicy = '16-mixed'\n[grid]\nseed = [0, 1]\n",
    # fp32 only at another learning rate: not the same problem
    "[zip]\npolicy = ['32-true', '16-mixed']\nlr = [0.1, 1.0]\n",
    # fp32 cells only: they are the references
    "[base]\npolicy = '32-true'\n[grid]\nscaler = ['none', 'static:4']\n",
])
def test_no_baseline_where_the_sweep_has_no_fp32_cell_of_the_problem(text):
    assert _baselines(text)[0] == {}


def _records(losses):
    return [StepRecord(i, loss, 1.0, False, False, 1.0, 0.25, 0.5, 0.01)
            for i, loss in enumerate(losses)]


CONFIG = {"classes": 4, "policy": "16-mixed", "master": None, "scaler": None, "seed": 0}


def _row(cell: int, trailing: float, **config) -> dict:
    """A cell's own row whose trailing loss is ``trailing`` (its last 10 losses)."""
    row = summarize(cell, f"k{cell}", dict(CONFIG, **config), _records([1.4] * 5 +
                    [trailing] * 10), 1.0, 0.5, None)
    assert row["trailing_loss"] == pytest.approx(trailing, rel=1e-15)
    return row


def test_two_seeds_either_side_of_the_fixed_threshold_are_judged_alike():
    fp32 = [_row(0, 1.2300, policy="32-true", seed=0), _row(1, 1.2450, policy="32-true", seed=1)]
    fp16 = [_row(2, 1.2402, seed=0), _row(3, 1.2500, seed=1)]
    # alone, the fixed threshold splits them: the tie the phase map drew as stalled
    assert [r["outcome"] for r in fp16] == ["converged", "stalled"]
    assert 1.2402 < CONVERGED * PLATEAU < 1.2500
    table = judge([*fp32, *fp16], {2: 0, 3: 1})
    assert [(r["outcome"], r["judged_by"], r["baseline_cell"]) for r in table] == [
        ("converged", "absolute", None), ("converged", "absolute", None),
        ("converged", "baseline", 0), ("converged", "baseline", 1)]
    assert table[3]["baseline_trailing_loss"] == fp32[1]["trailing_loss"]
    assert fp16[1]["outcome"] == "stalled"        # the cell's own row is left as it was


def test_the_rule_is_closer_to_the_baseline_than_to_the_plateau():
    baseline = 0.5
    midpoint = (baseline + PLATEAU) / 2
    assert midpoint - baseline == PLATEAU - midpoint       # exactly halfway: converged
    cases = {midpoint: "converged", math.nextafter(midpoint, 2.0): "stalled",
             0.3: "converged", 1.2: "stalled", 1.0: "stalled"}
    for trailing, outcome in cases.items():
        cell = dict(_row(1, 1.0), trailing_loss=trailing)
        rows = judge([_row(0, baseline, policy="32-true"), cell], {1: 0})
        assert (rows[1]["outcome"], rows[1]["judged_by"]) == (outcome, "baseline"), trailing


def test_diverged_and_failed_keep_their_outcome_against_a_baseline():
    fp32 = _row(0, 0.5, policy="32-true")
    nan = summarize(1, "k1", CONFIG, _records([1.4, math.nan]), 1.0, 0.5, None)
    failed = summarize(2, "k2", CONFIG, [], None, 0.1, "ValueError: no")
    table = judge([fp32, nan, failed], {1: 0, 2: 0})
    assert [(r["outcome"], r["judged_by"]) for r in table[1:]] == [
        ("diverged", "baseline"), ("failed", None)]


def test_fixed_thresholds_judge_where_the_baseline_is_unfinished_failed_or_stalled():
    cell = _row(1, 1.2500)
    assert judge([cell], {1: 0})[0] == dict(cell, judged_by="absolute", baseline_cell=0,
                                                 baseline_trailing_loss=None)
    stalled = _row(0, 1.3, policy="32-true")      # fp32 never left the plateau
    judged = judge([stalled, cell], {1: 0})[1]
    assert (judged["outcome"], judged["judged_by"], judged["baseline_trailing_loss"]) == (
        "stalled", "absolute", stalled["trailing_loss"])
    failed = summarize(0, "k0", dict(CONFIG, policy="32-true"), [], None, 0.1, "ValueError")
    assert judge([failed, cell], {1: 0})[1]["judged_by"] == "absolute"


def test_a_sweep_without_baselines_keeps_every_outcome():
    rows = [_row(0, 1.2402), _row(1, 1.2500, seed=1), _row(2, 0.3, seed=2)]
    table = judge(rows, {})
    assert [r["outcome"] for r in table] == ["converged", "stalled", "converged"]
    assert all(t == dict(r, judged_by="absolute", baseline_cell=None,
                         baseline_trailing_loss=None) for t, r in zip(table, rows))


COLUMNS = [*HEAD, "classes", "policy", "master", "scaler", "seed", *TABLE_METRICS]


def _table(tmp_path, monkeypatch) -> list[str]:
    from fpsim.sweep import results

    monkeypatch.setattr(results, "parquet_available", lambda: False)
    failed = summarize(3, "k3", CONFIG, [], None, 0.1, "ValueError: no")
    # cell 2 (seed 1) has no fp32 run in this table: the fixed thresholds judge it
    rows = judge([_row(0, 0.5, policy="32-true"), _row(1, 0.9), _row(2, 1.2, seed=1), failed],
                 {1: 0, 3: 0})
    write_tables(tmp_path, rows, COLUMNS)
    return (tmp_path / "results.csv").read_text().splitlines(keepends=True)


def test_the_judgement_columns_are_written_and_read_back(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch)
    table = read_table(tmp_path / "results.csv")
    assert [(r["judged_by"], r["baseline_cell"], r["outcome"]) for r in table] == [
        ("absolute", "", "converged"), ("baseline", "0", "converged"),
        ("absolute", "", "converged"), ("", "0", "failed")]
    assert table[1]["baseline_trailing_loss"] == table[0]["trailing_loss"] == repr(0.5)


@pytest.mark.parametrize("line,column,value,message", [
    (2, "judged_by", "vibes", "judged_by 'vibes' is not among baseline, absolute"),
    (2, "judged_by", "", "judged_by '' is not among"),
    (5, "judged_by", "absolute", "for a failed cell"),
    (3, "baseline_cell", "zero", "baseline_cell 'zero' is not a cell number"),
    (3, "baseline_trailing_loss", "nan", "baseline_trailing_loss 'nan' is not a finite"),
    (3, "baseline_trailing_loss", "", "without a baseline_cell and its baseline_trailing"),
    (3, "baseline_cell", "7", "judged against baseline cell 7, which the table does not hold"),
])
def test_a_damaged_judgement_is_refused_naming_the_file_and_row(tmp_path, monkeypatch, line,
                                                                column, value, message):
    lines = _table(tmp_path, monkeypatch)
    fields = lines[line - 1].rstrip("\n").split(",")
    fields[COLUMNS.index(column)] = value
    lines[line - 1] = ",".join(fields) + "\n"
    (tmp_path / "results.csv").write_text("".join(lines))
    with pytest.raises(ValueError) as err:
        read_table(tmp_path / "results.csv")
    text = str(err.value)
    assert "\n" not in text and message in text
    assert text.startswith(f"{tmp_path / 'results.csv'} line {line}: ")


def test_the_phase_map_draws_the_judged_outcomes_and_says_how_they_were_judged(
        tmp_path, monkeypatch):
    import json

    import fpsim.plots.phase as plots_phase
    from fpsim.sweep import phase_diagram
    from fpsim.sweep.record import SWEEP_FORMAT

    spec = {"name": "ties", "description": "", "base": {},
            "grid": {"policy": ["32-true", "16-mixed"], "lr": [0.1], "seed": [0, 1]},
            "zip": {}}
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"format": SWEEP_FORMAT, "version": 1, "fpsim": "x", "spec": spec, "cells": []}))
    rows = [_row(0, 1.2300, policy="32-true", seed=0), _row(1, 1.2450, policy="32-true", seed=1),
            _row(2, 1.2402, seed=0), _row(3, 1.2500, seed=1)]
    columns = [*HEAD, "classes", "policy", "lr", "master", "scaler", "seed", *TABLE_METRICS]
    write_tables(tmp_path, judge([dict(row, lr=0.1) for row in rows], {2: 0, 3: 1}), columns,
                 parquet=False)
    drawn = {}
    monkeypatch.setattr(plots_phase, "plot_phase_diagram",
                        lambda panels, **kwargs: drawn.update(panels, title=kwargs["title"]))
    phase_diagram(tmp_path, "policy", "lr")
    # both fp16 seeds converged against their fp32 runs: one outcome, not a 'mixed' square
    assert drawn[""] == [[("converged", {}, 2), ("converged", {}, 2)]]
    assert drawn["title"] == ("ties\n2 of 4 runs judged against their fp32 run, the rest by "
                              "fixed thresholds")


def test_a_table_from_before_the_judgement_columns_says_how_to_rewrite_it(tmp_path,
                                                                          monkeypatch):
    lines = _table(tmp_path, monkeypatch)
    header = lines[0].rstrip("\n").split(",")
    keep = [i for i, name in enumerate(header) if name not in JUDGEMENT]
    (tmp_path / "results.csv").write_text("".join(
        ",".join(line.rstrip("\n").split(",")[i] for i in keep) + "\n" for line in lines))
    with pytest.raises(ValueError, match="lacks judged_by, baseline_cell, baseline_trailing_loss"
                       ": a table written before .* rerun fpsim sweep with its spec and "
                       f"--out {tmp_path} to rewrite it"):
        read_table(tmp_path / "results.csv")
