"""A researcher's own runs: `fpsim plot` and `fpsim compare` (JSON Lines and CSV traces,
interrupted runs, framework scaler traces), the precision recipes' defaults and their
overrides, and help texts that say what the defaults are."""
import json
import math
import struct
from pathlib import Path

import pytest

from fpsim.cli import main
from fpsim.conformance import TraceStep, TraceWriter
from fpsim.plots import figure_style, plot_runs, runs_figure
from fpsim.train import compare_runs, load_run, recipe_for

SMALL = ["--steps", "12", "--samples", "128", "--hidden", "8", "--quiet"]


def train_run(folder, *options):
    assert main(["train", *SMALL, "--out", str(folder), *options]) == 0
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five small runs: a and a2 identical, csv the same as CSV, lr differing from step 1,
    nan (lr 1e4, no scaler: the loss goes NaN), skip (a static scale that overflows)."""
    base = tmp_path_factory.mktemp("runs")
    return {
        "a": train_run(base / "a"),
        "a2": train_run(base / "a2"),
        "csv": train_run(base / "csv", "--trace-format", "csv"),
        "lr": train_run(base / "lr", "--lr", "0.2"),
        "nan": train_run(base / "nan", "--lr", "1e4", "--scaler", "none"),
        "skip": train_run(base / "skip", "--scaler", "static:1e30"),
    }


def test_compare_identical_runs_and_across_trace_layouts(runs, capsys):
    assert main(["compare", str(runs["a"]), str(runs["a2"])]) == 0
    assert capsys.readouterr().out.startswith("bit-identical: 12 steps")
    assert compare_runs(runs["a"], runs["csv"] / "trace.csv").identical


def test_compare_names_the_first_difference_with_bits(runs, capsys):
    assert main(["compare", str(runs["a"]), str(runs["lr"])]) == 1
    out = capsys.readouterr().out
    difference = compare_runs(runs["a"], runs["lr"]).difference
    assert difference.step == 1 and difference.field == "loss"  # step 0 ran before any update
    bits = f"0x{struct.unpack('<I', struct.pack('<f', difference.a))[0]:08x}"
    assert out.startswith("differ first at step 1, field loss (after 1 bit-identical steps)")
    assert bits in out and "<- differs" in out
    assert "config.optimizer" in out  # the configuration difference behind it


def test_compare_runs_of_different_lengths(runs, tmp_path):
    short = train_run(tmp_path / "short", "--steps", "5")
    comparison = compare_runs(runs["a"], short)
    assert comparison.difference is None and not comparison.identical
    assert comparison.lengths == (12, 5) and "A has 7 more step(s)" in str(comparison)


def interrupt(run: Path, keep: int, target: Path) -> Path:
    """A copy of ``run`` as a Ctrl-C after ``keep`` steps leaves it: run.json without a
    summary, the trace cut short."""
    target.mkdir()
    info = json.loads((run / "run.json").read_text())
    info.pop("summary")
    (target / "run.json").write_text(json.dumps(info))
    lines = (run / "trace.jsonl").read_text().splitlines(keepends=True)[:keep]
    (target / "trace.jsonl").write_text("".join(lines))
    return target


def test_interrupted_run_loads_plots_and_compares(runs, tmp_path):
    cut = load_run(interrupt(runs["a"], 5, tmp_path / "cut"))
    assert not cut.complete and cut.steps == tuple(range(5))
    assert cut.label == "16-mixed, scaler dynamic, seed 0 (interrupted after step 4)"
    comparison = compare_runs(runs["a"], cut)
    assert comparison.identical_steps == 5 and comparison.difference is None
    assert plot_runs([runs["a"], cut.source], tmp_path / "cut.png").stat().st_size > 0


def scaler_trace(path: Path, overflows) -> Path:
    scale = 65536.0
    with TraceWriter(path, source="torch 2.13.0 GradScaler('cpu')") as writer:
        for step, found in enumerate(overflows):
            after = scale / 2 if found else scale
            writer.write(TraceStep(step, found, scale, after, found,
                                   grad_stats={"count": 10, "nonfinite": int(found),
                                               "l2_norm": 0.5 + step}))
            scale = after
    return path


def test_framework_scaler_traces_plot_and_compare(runs, tmp_path, capsys):
    one = scaler_trace(tmp_path / "one.jsonl", [False, True, False, False])
    two = scaler_trace(tmp_path / "two.jsonl", [False, True, True, False])
    out = tmp_path / "mixed.svg"
    assert main(["plot", str(one), str(runs["a"]), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"<?xml")
    assert main(["compare", str(one), str(two)]) == 1
    assert "differ first at step 2, field scale_after" in capsys.readouterr().out


def test_figure_marks_skipped_and_nan_steps(runs):
    with figure_style():
        fig = runs_figure([runs["nan"], runs["skip"]])
        loss_ax, scale_ax, underflow_ax, lost_ax, norm_ax, legend_ax = fig.axes
        nan_steps = [s for s, v in zip(*_columns(runs["nan"], "loss")) if not math.isfinite(v)]
        skipped = [s for s, v in zip(*_columns(runs["skip"], "skipped")) if v]
        markers = {line.get_marker(): list(line.get_xdata()) for line in loss_ax.get_lines()
                   if line.get_marker() in ("v", "x")}
        assert nan_steps and markers["v"] == nan_steps
        assert skipped == list(range(12)) and markers["x"] == skipped
        assert scale_ax.get_yscale() == "log"
        legend = [t.get_text() for t in legend_ax.get_legend().get_texts()]
        # labelled by what differs: the learning rate and the scaler
        assert legend == ["lr 10000.0, scaler none", "lr 0.1, scaler static:1e+30"]
        import matplotlib.pyplot as plt

        plt.close(fig)


def _columns(path, name):
    run = load_run(path)
    return run.steps, run.column(name)


def test_plot_is_byte_stable_and_takes_labels(runs, tmp_path):
    first, second = tmp_path / "1.png", tmp_path / "2.png"
    plot_runs([runs["a"], runs["lr"]], first, labels=["base", "lr 0.2"])
    plot_runs([runs["a"], runs["lr"]], second, labels=["base", "lr 0.2"])
    assert first.read_bytes() == second.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["1.png", "2.png"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["1.png", "2.png"]


@pytest.mark.parametrize("argv,message", [
    (["plot", "{a}", "--out", "{tmp}/x.pdf"], "must end in .png or .svg"),
    (["plot", "{a}", "{a}", "--out", "{tmp}/x.png", "--label", "one"],
     "got 1 label(s) for 2 run(s)"),
    (["plot", "{tmp}/missing", "--out", "{tmp}/x.png"], "no run at"),
    (["plot", "{bad}", "--out", "{tmp}/x.png"], "line 2"),
    (["compare", "{a}", "{tmp}/missing"], "no run at"),
    (["train", "--plot", "--steps", "2"], "--plot draws the run into its --out folder"),
])
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text((runs["a"] / "trace.jsonl").read_text().splitlines()[0] + "\n{oops\n")
    argv = [arg.format(a=runs["a"], tmp=tmp_path, bad=bad) for arg in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fpsim: error: ") and message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


@pytest.mark.parametrize("policy,master,scaler", [
    ("32-true", None, "none"), ("16-mixed", "fp32", "dynamic"), ("bf16-mixed", "fp32", "none"),
    ("16-true", None, "none"), ("bf16-true", None, "none"),
])
def test_recipes_follow_lightning(policy, master, scaler):
    recipe = recipe_for(policy)
    assert (recipe.master, recipe.scaler) == (master, scaler)


def test_recipe_defaults_and_overrides_are_visible(tmp_path, capsys):
    plain = train_run(tmp_path / "plain", "--policy", "16-true")
    info = json.loads((plain / "run.json").read_text())["config"]
    assert info["master"] is None and info["scaler_name"] == "none"
    assert info["recipe"] == {"master": None, "scaler": "none"} and info["overrides"] == {}
    assert main(["train", "--steps", "3", "--samples", "64", "--hidden", "4", "--policy",
                 "16-true", "--scaler", "dynamic"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("recipe 16-true: master none, scaler dynamic (--scaler; the recipe's "
                      "is none)")
    assert out[-1].startswith("nothing written (no --out)")
    changed = train_run(tmp_path / "changed", "--policy", "16-true", "--master", "fp32")
    info = json.loads((changed / "run.json").read_text())["config"]
    assert info["overrides"] == {"master": "fp32"}


def test_python_train_defaults_to_the_recipe():
    from fpsim import nn, use_policy
    from fpsim.train import make_dataset, train

    data = make_dataset("teacher", n=64, features=4, classes=2, seed=0)
    for policy, scale, master in (("16-mixed", 65536.0, "fp32"), ("16-true", 1.0, None)):
        with use_policy(policy):
            model = nn.MLP([4, 8, 2], rng=0)
        result = train(model, data, policy=policy, steps=2, batch_size=8, progress=False)
        assert result.records[0].scale == scale
        assert (str(result.optimizer.master_fmt) if result.optimizer.master_fmt else None) \
            == master


@pytest.mark.parametrize("command", ["train", "reproduce", "plot", "compare", "describe",
                                     "check-scaler", "check-cast"])
def test_help_is_plain_text_with_defaults(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":func:" not in text
    description = text.split("\n\n")[1]
    assert description.rstrip().endswith((".", ":", ")")), description  # no sentence cut off
    if command == "train":
        assert "learning rate (default: 0.1)" in text
        assert "(default: the recipe's" in text
    if command == "reproduce":
        assert "(default: figures, or figures/quick with --quick" in " ".join(text.split())


def test_train_plot_draws_the_run_beside_its_trace(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--steps", "4", "--samples", "64", "--hidden", "4", "--out", str(out),
                 "--plot"]) == 0
    assert (out / "trace.png").read_bytes().startswith(b"\x89PNG")
    assert f"wrote {out}/trace.png" in capsys.readouterr().out
