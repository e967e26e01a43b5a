"""Experiment 4's numbers (quick mode): pinned, and telling the story the summary tells."""

from fpsim.experiments import reproduce
from pinned import assert_pinned

PINNED = "e66865a0394614cab0495b1cd4023d9be8be2f3e036932637edf9e7c7bcbb7f8"


def test_overflow_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["overflow"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "overflow.png", "overflow.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    steps = result.numbers["task"]["steps"]
    runs = result.numbers["runs"]
    skip, noskip = runs["static 2^24, skip on overflow"], runs["static 2^24, no skip"]
    torch, ds = runs["torch GradScaler"], runs["DeepSpeed DynamicLossScaler"]
    # A static 2**24 overflows every step: skipped for ever (nothing learnt) or NaN weights.
    assert skip["skipped_steps"] == skip["overflows"] == steps and not skip["weights_changed"]
    assert noskip["skipped_steps"] == 0 and noskip["first_nonfinite_loss_step"] == 1
    assert noskip["nonfinite_parameter_fraction"] > 0.5
    # Dynamic scalers back off, then grow and overflow again: a sawtooth.
    for run in (torch, ds):
        assert 0 < run["skipped_steps"] < steps // 10
        assert run["growths"] >= 2 and run["backoffs"] > run["growths"]
        assert run["mean_loss_last_50"] < 0.8 * skip["mean_loss_last_50"]
    assert torch["overflows_absorbed_by_hysteresis"] == 0
    assert ds["overflows_absorbed_by_hysteresis"] > 0
    assert ds["skipped_steps"] == ds["backoffs"] + ds["overflows_absorbed_by_hysteresis"]
    assert torch["scale_changes"][0] == ds["scale_changes"][0] == [0, 24]
    assert ds["scale_changes"][1][0] == 2          # the first overflow is absorbed
    assert torch["scale_changes"][1][0] == 1
    assert_pinned("overflow", result.numbers, PINNED)
