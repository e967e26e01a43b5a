"""`fpsim compare` across recipes: beside the first differing bit, the runs side by side."""
import math

from fpsim.cli import main
from fpsim.train import StepRecord, TraceWriter, compare_runs
from fpsim.train.run_summary import outcome


def write_run(folder, losses, skipped=()):
    folder.mkdir()
    with TraceWriter(folder / "trace.jsonl") as writer:
        for step, loss in enumerate(losses):
            writer.write(StepRecord(step, loss, 1.0, False, step in skipped, 0.5, 0.0, 0.0,
                                    0.01))


def test_the_outcome_of_a_run_names_its_best_step_and_where_it_diverged():
    result = outcome((0, 1, 2, 3), {"loss": (2.0, 1.0, math.inf, math.nan),
                                    "skipped": (False, True, True, False)})
    assert result == (result.final_loss, 1.0, 1, 2, 2) and math.isnan(result.final_loss)
    assert outcome((0,), {"loss": (math.nan,)}).best_loss is None


def test_compare_shows_two_recipes_side_by_side(tmp_path, capsys):
    write_run(tmp_path / "fp16", [2.0, 1.5, 1.0, 0.5], skipped=(1,))
    write_run(tmp_path / "bf16", [2.0, 1.25, math.nan, math.nan])
    text = str(compare_runs(tmp_path / "fp16", tmp_path / "bf16"))
    assert "differ first at step 1, field loss" in text
    assert "  final loss     0.5 | nan" in text
    assert "  best loss      0.5 at step 3 | 1.25 at step 1" in text
    assert "  skipped steps  1 | 0" in text
    assert "  diverged       no | at step 2" in text
    assert "  loss B - A     mean -0.125, largest -0.25 at step 1 (over 2 steps" in text
    assert main(["compare", str(tmp_path / "fp16"), str(tmp_path / "bf16")]) == 1
    assert "side by side (A | B):" in capsys.readouterr().out
    write_run(tmp_path / "same", [2.0, 1.5, 1.0, 0.5], skipped=(1,))
    assert "side by side" not in str(compare_runs(tmp_path / "fp16", tmp_path / "same"))
