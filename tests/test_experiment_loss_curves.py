"""Experiment 2's numbers (quick mode): pinned, and telling the story the summary tells."""
import math

from fpsim.experiments import reproduce
from pinned import assert_pinned
from fpsim.experiments.loss_curves import PLATEAU, escape_step, median, spike, typical_gap
from fpsim.train import StepRecord

PINNED = "f47c0c167ee0d3778027ab102da881b70491f8eb1ab9071412bc17fb0c99403d"


def test_helpers():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    plateau = [2.08] * 20
    assert escape_step(plateau) is None
    assert escape_step(plateau + [0.5] * 20) == 21   # the 10-step mean first drops below 1.87
    assert typical_gap([1.0] * 5, [1.0] * 4 + [100.0]) == 0.0   # one spike does not count


def test_spike_is_traced_to_its_outlier_batch():
    """A run that has learned (loss 0.05, gradient norm 1) meets a batch with a gradient 50x
    the usual at step 40; its loss climbs to 30 at step 44, whose overflow is skipped twice."""
    losses = [2.08] * 10 + [0.05] * 30 + [1.0, 0.2, 0.4, 0.6, 30.0, 12.0, 0.5] + [0.05] * 20
    records = []
    for step, loss in enumerate(losses):
        skipped = step in (44, 45)
        records.append(StepRecord(step, loss, 1024.0 if step < 46 else 256.0, skipped, skipped,
                                  float("nan") if skipped else (50.0 if step == 40 else 1.0),
                                  0.0, 0.0, 0.0))
    found = spike(records, escape_step(losses))
    assert found["step"] == 44 and found["loss"] == 30.0 > PLATEAU
    assert (found["trigger_step"], found["trigger_grad_norm"], found["usual_grad_norm"]) == \
        (40, 50.0, 1.0)
    assert found["skipped_steps"] == [44, 45] and found["scale_after"] == 256.0
    assert spike(records[:40], escape_step(losses[:40])) is None   # no spike above the plateau


def test_loss_curves_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["loss_curves"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "loss_curves.png", "loss_curves.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    runs = result.numbers["runs"]
    fp32, none, s128, dyn = (runs[k] for k in runs)
    assert [r["policy"] for r in (fp32, none, s128, dyn)] == ["32-true"] + ["16-mixed"] * 3
    # fp32 leaves the ln 8 plateau; without loss scaling fp16 mixed does not
    assert fp32["escape_step"] is not None and fp32["escape_step"] < 100
    assert none["escape_step"] is None
    assert abs(none["final_loss"] - math.log(8)) < 0.02
    assert none["final_loss"] > fp32["final_loss"] + 0.5
    # ... because the first layers' gradients all flush to zero: not one weight moves
    assert none["weights_moved_at_snapshot"][:3] == [0.0, 0.0, 0.0]
    assert min(fp32["weights_moved_at_snapshot"][:3]) > 0.5
    assert none["mean_underflow_fraction"] > 0.15 > s128["mean_underflow_fraction"]
    assert dyn["mean_underflow_fraction"] < 0.01
    # scaled runs track fp32
    for r in (s128, dyn):
        assert abs(r["escape_step"] - fp32["escape_step"]) <= 5
        assert abs(r["final_gap_to_fp32"]) < 0.15 and r["typical_gap_to_fp32"] < 0.1
    assert none["typical_gap_to_fp32"] > 0.5
    # the dynamic scaler halves once per overflowing (skipped) step
    assert dyn["final_scale"] == 65536.0 / 2 ** dyn["skipped_steps"]
    assert s128["skipped_steps"] == none["skipped_steps"] == 0
    assert_pinned("loss_curves", result.numbers, PINNED)
