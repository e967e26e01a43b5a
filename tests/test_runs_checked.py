"""fpsim plot and fpsim compare read runs with the checks resuming uses: a trace whose steps
do not run 0, 1, 2, ... once each, with unknown fields, or empty, is refused with one line
naming the step; a run.json of the wrong shape is named; the one tolerated defect is a last
line torn by an interruption, drawn and compared up to the step before it, with a note.
Labels and the comparison's configuration lines show what differs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fpsim.cli import main
from fpsim.plots.runs import distinguishing_labels, open_run
from fpsim.train import StepRecord, TraceWriter
from fpsim.train.fp8_stats import FP8_TABLE, Fp8Stats
from fpsim.train.layer_stats import LAYERS, LayerStats, StepTableWriter
from fpsim.train.runs import compare_runs, shown_apart


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fpsim: error: "), captured.err
    return lines[0]


def record(step: int, loss: float = 0.5) -> StepRecord:
    return StepRecord(step, loss, 1.0, False, False, 0.5, 0.0, 0.0, 0.01)


def run_folder(folder: Path, steps, info: "dict | str | None" = None) -> Path:
    folder.mkdir(parents=True)
    with TraceWriter(folder / "trace.jsonl") as writer:
        for step in steps:
            writer.write(record(step))
    if info is not None:
        (folder / "run.json").write_text(info if isinstance(info, str) else json.dumps(info))
    return folder


DEFECTS = {"starts at -1": ([-1, 0, 1], "line 1: the trace starts at step -1"),
           "a gap": ([0, 1, 3, 4], "line 3: step 2 is missing (step 3 follows step 1)"),
           "a wider gap": ([0, 4], "line 2: steps 1..3 are missing"),
           "a duplicate": ([0, 1, 1, 2], "line 3: step 1 appears twice (line 2"),
           "out of order": ([0, 1, 2, 0], "line 4: step 0 appears twice"),
           "empty": ([], "holds no steps")}


@pytest.mark.parametrize("defect", DEFECTS)
@pytest.mark.parametrize("command", ["compare", "plot"])
def test_defective_traces_are_refused_naming_the_step(tmp_path, capsys, defect, command):
    steps, expected = DEFECTS[defect]
    bad = run_folder(tmp_path / "bad", steps)
    good = run_folder(tmp_path / "good", range(max(len(steps), 1)))
    argv = ([command, str(good), str(bad)] if command == "compare"
            else [command, str(good), str(bad), "--out", str(tmp_path / "f.png")])
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert expected in line and str(bad / "trace.jsonl") in line
    assert not (tmp_path / "f.png").exists()


def test_compare_refuses_unknown_fields(tmp_path, capsys):
    a = run_folder(tmp_path / "a", range(3))
    b = run_folder(tmp_path / "b", range(3))
    lines = (b / "trace.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["extra"] = 1
    lines[1] = json.dumps(row)
    (b / "trace.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["compare", str(a), str(b)]) == 2
    assert "line 2: unknown field(s) extra" in one_error_line(capsys)


def test_a_torn_last_line_is_drawn_and_compared_up_to_the_step_before(tmp_path, capsys):
    a = run_folder(tmp_path / "a", range(4), {"config": {"policy": "16-mixed", "steps": 10}})
    trace = a / "trace.jsonl"
    trace.write_text(trace.read_text() + '{"step": 4, "lo')          # killed mid-write
    b = run_folder(tmp_path / "b", range(4))
    assert main(["plot", str(a), "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").exists()
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bit-identical: 4 steps")
    assert f"note: A: {trace}: the last line was torn by an interruption" in out
    assert "(interrupted after step 3)" in open_run(a).label


SHAPES = {"a list": "[1]", "a string": '"run"', "null": "null", "config a list": '{"config": []}',
          "summary a string": '{"config": {}, "summary": "done"}',
          "steps a string": '{"config": {"steps": "10"}}',
          "policy a number": '{"config": {"policy": 16}}', "not JSON": '{"config": ',
          "deeply nested": "[" * 100000 + "]" * 100000}


SUMMARIES = {"steps a string": ({"steps": "2"}, "summary.steps must be an integer >= 0, got '2'"),
             "steps a bool": ({"steps": True}, "summary.steps must be an integer >= 0"),
             "final_loss a word": ({"final_loss": "low"}, "summary.final_loss must be a number"),
             "skipped_steps negative": ({"skipped_steps": -1}, "summary.skipped_steps must be"),
             "loss_sha256 short": ({"loss_sha256": "abc"}, "summary.loss_sha256 must be a "
                                                           "SHA-256 in hex"),
             "nonfinite_loss_steps strings": ({"nonfinite_loss_steps": ["1"]},
                                              "summary.nonfinite_loss_steps must be a list"),
             "final_scale null": ({"final_scale": None}, "summary.final_scale must be a number"),
             "steps not the trace's": ({"steps": 5}, "summary.steps is 5, but ")}


@pytest.mark.parametrize("summary", SUMMARIES)
@pytest.mark.parametrize("command", ["compare", "plot"])
def test_a_run_json_summary_field_of_the_wrong_kind_is_named(tmp_path, capsys, summary,
                                                              command):
    fields, expected = SUMMARIES[summary]
    bad = run_folder(tmp_path / "bad", range(2), {"config": {}, "summary": fields})
    good = run_folder(tmp_path / "good", range(2))
    argv = ([command, str(good), str(bad)] if command == "compare"
            else [command, str(bad), "--out", str(tmp_path / "f.png")])
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"fpsim: error: {bad / 'run.json'}: ") and expected in line
    assert not (tmp_path / "f.png").exists()


def test_a_whole_summary_as_training_writes_it_is_read(tmp_path):
    summary = {"steps": 2, "final_loss": 0.5, "loss_sha256": "0" * 64, "skipped_steps": 0,
               "nonfinite_loss_steps": [], "final_scale": "inf"}
    run = open_run(run_folder(tmp_path / "run", range(2), {"config": {}, "summary": summary}))
    assert run.complete and run.config["summary"] == summary


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("command", ["compare", "plot"])
def test_a_run_json_of_the_wrong_shape_is_named(tmp_path, capsys, shape, command):
    bad = run_folder(tmp_path / "bad", range(2), SHAPES[shape])
    good = run_folder(tmp_path / "good", range(2))
    argv = ([command, str(good), str(bad)] if command == "compare"
            else [command, str(bad), "--out", str(tmp_path / "f.png")])
    assert main(argv) == 2
    assert str(bad / "run.json") in one_error_line(capsys)


def test_plot_labels_name_the_fields_that_differ(tmp_path):
    def info(optimizer: str) -> dict:
        return {"config": {"policy": "16-mixed", "scaler_name": "dynamic", "seed": 0,
                           "optimizer": optimizer, "scaler": "DynamicScaler(...)"},
                "summary": {}}

    sgd = run_folder(tmp_path / "sgd", range(2),
                     info("SGD(lr=0.1, momentum=0.9, dampening=0.0, nesterov=False, "
                          "weight_decay=0.0)"))
    adam = run_folder(tmp_path / "adam", range(2),
                      info("Adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, "
                           "weight_decay=0.0)"))
    assert open_run(sgd).label == open_run(adam).label      # the old labels: the same
    assert distinguishing_labels([open_run(sgd), open_run(adam)]) == [
        "optimizer SGD, lr 0.1", "optimizer Adam, lr 0.001"]


def test_compare_shows_where_long_values_differ(tmp_path):
    stem = "Linux-6.1.0-x86_64-with-glibc2.36-" + "x" * 80
    a = run_folder(tmp_path / "a", range(2), {"platform": stem + "-A", "summary": {}})
    b = run_folder(tmp_path / "b", range(2), {"platform": stem + "-B", "summary": {}})
    text = str(compare_runs(a, b))
    line = next(line for line in text.splitlines() if line.startswith("  platform:"))
    assert "-A'" in line and "-B'" in line
    assert shown_apart("same", "same") == ("'same'", "'same'")


def with_layers(folder: Path, rows: int, grad_max: float = 1.0, table=LAYERS) -> Path:
    """``folder`` with a record file of ``rows`` steps of two columns (``layers.jsonl``, or
    ``fp8.jsonl`` with ``table=FP8_TABLE``); the last step's first value ``grad_max``."""
    row = LayerStats if table is LAYERS else Fp8Stats
    writer = StepTableWriter(table, folder / table.file, ["fc.weight", "fc.bias"])
    for step in range(rows):
        last = grad_max if step == rows - 1 else 1.0
        writer.write(row(step, (0.0, 0.0), (0.5, 0.5), (last, 2.0)))
    writer.close()
    return folder


def test_compare_compares_the_record_files_bit_for_bit(tmp_path, capsys):
    a = with_layers(run_folder(tmp_path / "a", range(3)), 3, grad_max=0.0)
    b = with_layers(run_folder(tmp_path / "b", range(3)), 3, grad_max=0.0)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bit-identical: 3 steps, every value of loss, ")
    assert "and of layers.jsonl (wall_time not compared)" in out
    c = with_layers(run_folder(tmp_path / "c", range(3)), 3, grad_max=-0.0)   # 0.0's sign
    assert main(["compare", str(a), str(c)]) == 1
    assert capsys.readouterr().out.startswith(
        "differ first at step 2, field layers.jsonl grad_max[fc.weight] (after 2 bit-identical "
        "steps)")
    d = with_layers(run_folder(tmp_path / "d", range(3)), 2)
    assert main(["compare", str(a), str(d)]) == 1
    assert "A's layers.jsonl has 1 more step(s) than the other" in capsys.readouterr().out


@pytest.mark.parametrize("garbage", ["not json\n", "", '{"step": 0, "grad_max": "x"}\n'])
def test_a_malformed_record_file_is_never_identical(tmp_path, capsys, garbage):
    a = with_layers(run_folder(tmp_path / "a", range(3)), 3)
    b = run_folder(tmp_path / "b", range(3))
    header = (a / "layers.jsonl").read_text().splitlines()[0] + "\n"
    (b / "layers.jsonl").write_text(header + garbage if garbage.startswith("{") else garbage)
    for argv in (["compare", str(a), str(b)], ["compare", str(b), str(a)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert captured.out == "" and len(lines) == 1, captured
        assert lines[0].startswith(f"fpsim: error: {b / 'layers.jsonl'}")


def test_what_was_not_compared_is_said(tmp_path, capsys):
    a = with_layers(run_folder(tmp_path / "a", range(2)), 2, table=FP8_TABLE)
    b = run_folder(tmp_path / "b", range(2))
    (a / "checkpoint.npz").write_bytes(b"")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "note: fp8.jsonl not compared: only A has one" in out
    assert "note: checkpoint.npz not compared" in out
