"""Experiment 5's numbers (quick mode): pinned, and telling the story the summary tells."""

from fpsim.experiments import reproduce
from pinned import assert_pinned

PINNED = "8767db296b8a0f0358f5356a7709d90e48bc550789ac2b304765fc35f08ee6bf"


def test_bf16_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["bf16"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bf16.png", "bf16.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    c = result.numbers["classifier"]
    fp32, bf16 = c["fp32 (32-true)"], c["bf16-mixed, no loss scaling"]
    fp16 = c["16-mixed, no loss scaling"]
    # bf16-mixed without a scaler: no gradient underflow, tracks fp32.
    assert bf16["nonfinite_loss_steps"] == 0 and bf16["max_gradient_underflow_fraction"] == 0
    assert fp16["max_gradient_underflow_fraction"] > 0
    assert bf16["max_abs_loss_gap_to_fp32"] < 0.01
    assert abs(bf16["mean_loss_last_50"] - fp32["mean_loss_last_50"]) < 0.005
    assert bf16["mean_loss_last_50"] < 0.6
    # Without master weights bf16 loses more and stalls earlier and farther than fp16.
    r = result.numbers["regression"]
    r16, rbf = r["fp16 weights, no master copy"], r["bf16 weights, no master copy"]
    rbf_master = r["bf16 weights + fp32 master copy"]
    assert rbf["lost_updates"] > r16["lost_updates"]
    assert rbf["first_stalled_step"] < r16["first_stalled_step"]
    assert rbf["final_weight_error"] > 4 * r16["final_weight_error"]
    assert rbf_master["final_weight_error"] < r16["final_weight_error"] / 4
    assert rbf_master["lost_fraction"] < 0.01
    for run, bits in ((r16, 11), (rbf, 8)):   # nothing lost below 2**bits, all above 2**(bits+1)
        window = run[f"window_2^{bits}"]
        assert window["below"]["lost"] == 0
        assert window["above"]["lost"] == window["above"]["updates"] > 0
    assert_pinned("bf16", result.numbers, PINNED)
