"""Experiment 3's numbers (quick mode): pinned, and telling the story the summary tells."""

from fpsim.experiments import reproduce
from pinned import assert_pinned

PINNED = "469347478fd04856b820c485edaba243531e4a881e3374f2fc0082529c6dd1b9"


def test_master_weights_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["master_weights"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "master_weights.png", "master_weights.svg", "summary.json", "summary.md",
        "timings.json", "timings.md"]
    runs = result.numbers["runs"]
    fp16_only = runs["fp16 weights, no master copy"]
    master = runs["fp16 weights + fp32 master copy"]
    fp32 = runs["fp32 (32-true)"]
    # Without a master copy the run freezes: every update of the last 100 steps is lost.
    assert fp16_only["lost_fraction_last_100_steps"] == 1.0
    assert fp16_only["first_stalled_step"] is not None
    assert master["lost_fraction_last_100_steps"] < 0.05
    assert fp16_only["final_loss"] > 100 * master["final_loss"]
    assert fp16_only["final_weight_error"] > 10 * master["final_weight_error"]
    assert master["final_loss"] < 10 * fp32["final_loss"]        # the master copy tracks fp32
    # The 2048x rule holds exactly: nothing below 2**11 lost, everything above 2**12 lost.
    window = result.numbers["fp16_window"]
    assert window["below"]["lost"] == 0 and window["below"]["updates"] > 0
    assert window["above"]["lost"] == window["above"]["updates"] > 0
    bounds = result.numbers["fp16_lost_bounds"]
    assert (bounds["ratio_above_4096"] <= bounds["measured_lost"]
            <= bounds["ratio_at_least_2048"])
    assert bounds["measured_lost"] == fp16_only["lost_updates"]
    assert_pinned("master_weights", result.numbers, PINNED)
