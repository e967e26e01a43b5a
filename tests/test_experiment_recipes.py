"""Experiment 6's numbers (quick mode): pinned, and telling the story the summary tells."""
import json

from fpsim.experiments import reproduce
from pinned import assert_pinned
from fpsim.experiments._tasks import teacher_label_margin

PINNED = "30b2480d521161e6481614bd92b18cd3b7194bede9547b0cc72172f449dc2e6c"


def test_recipes_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["recipes"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "recipes.png", "recipes.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    rows = result.numbers["recipes"]
    lightning = ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]
    assert list(rows)[:5] == lightning
    for name in lightning:
        assert f"| {name} |" in result.table
    for name in ("32-true", "16-mixed", "bf16-mixed", "bf16-true"):
        assert not rows[name]["nan"] and rows[name]["heldout_accuracy"] > 0.7
        assert abs(rows[name]["mean_loss_last_50"] - rows["32-true"]["mean_loss_last_50"]) < 0.01
    # fp16 Adam without a master copy: eps rounds to 0, v underflows, the weights go inf/NaN.
    assert rows["16-true"]["nan"] and rows["16-true"]["first_nonfinite_loss_step"] == 1
    assert rows["16-true"]["heldout_accuracy"] == 0.0
    assert result.numbers["diagnosis"]["adam_eps_in_fp16"] == 0.0
    assert result.numbers["diagnosis"]["16_true_moments_after_step_1"]["v_zero_m_nonzero"] > 0
    variant = [name for name in rows if name not in lightning]
    assert len(variant) == 1 and not rows[variant[0]]["nan"]
    # bf16 without a master copy loses far more updates than the fp32-weight recipes.
    assert rows["bf16-true"]["mean_lost_update_fraction"] > 100 * max(
        rows[name]["mean_lost_update_fraction"] for name in ("32-true", "16-mixed", "bf16-mixed"))
    # steps/s are machine-dependent: in the timings (timings.md), never in the numbers.
    assert set(result.timings["steps_per_second"]) == set(rows)
    assert "steps_per_second" not in json.dumps(result.numbers)
    assert "steps/s" not in result.table and "steps/s" in result.timing_table
    assert_pinned("recipes", result.numbers, PINNED)


def test_teacher_labels_do_not_depend_on_rounding():
    # The labels are an argmax of float64 BLAS products and tanh, whose last bits may differ
    # between machines (~1e-16 relative); the closest call in the data set is far wider.
    assert teacher_label_margin() > 1e-6
