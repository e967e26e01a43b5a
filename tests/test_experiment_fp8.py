"""Experiment 8's numbers (quick mode): pinned, and telling the story the summary tells."""
from fpsim.experiments import reproduce
from pinned import assert_pinned

PINNED = "d9a0dca40029c35e25c546bf5c1671a31da39871413c4cf9d1c711810219309e"


def test_fp8_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["fp8"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fp8.png", "fp8.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    runs, outlier = result.numbers["runs"], result.numbers["outlier_step"]
    bf16, current, mx = runs["bf16-mixed"], runs["current"], runs["MXFP8"]
    delayed = {h: runs[f"delayed, history {h}"] for h in (1, 16, 128)}
    margin = runs["delayed, history 16, margin 4"]
    # Every recipe trains as bf16-mixed does.
    for label, run in runs.items():
        assert abs(run["mean_loss_last_50"] - bf16["mean_loss_last_50"]) < 0.01, label
        assert run["mean_abs_loss_gap_to_bf16"] < 0.01, label
    # Delayed scaling clips the outlier sample (one of 64 samples: 1/64 of the inputs) ...
    for run in list(delayed.values()) + [margin]:
        assert 0.9 / 64 < run["saturated_at_outlier"] <= 1 / 64
        assert run["largest_input_kept_at_outlier"] < (100 if run is margin else 10)
        assert run["max_saturated_elsewhere"] < 0.01
    # ... current scaling does not, but flushes the rest of the batch in that step.
    assert current["saturated_at_outlier"] == 0 == current["flushed_before_outlier"]
    assert current["flushed_at_outlier"] > 0.001
    # The history sets how long the small scale lasts; a margin flushes more.
    assert [delayed[h]["steps_with_small_scale_after"] for h in (1, 16)] == [1, 16]
    assert delayed[128]["steps_with_small_scale_after"] == 160 - outlier - 1   # to the end
    assert delayed[1]["flushed_after_outlier_128_steps"] < \
        delayed[16]["flushed_after_outlier_128_steps"] < \
        delayed[128]["flushed_after_outlier_128_steps"]
    assert margin["flushed_after_outlier_16_steps"] > 5 * delayed[16]["flushed_after_outlier_16_steps"]
    # MX confines the outlier to its own blocks.
    assert mx["saturated_at_outlier"] == 0 and mx["flushed_at_outlier"] == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "nothing saturated" in summary and "MXFP8 scales every" in summary
    assert_pinned("fp8", result.numbers, PINNED)
