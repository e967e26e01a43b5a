"""What the two language-model experiments (``lstm_lm``, ``transformer_lm``) both claim, checked
against a quick run's numbers: one implementation for both test files."""
from fpsim.experiments._language import RUNS


def assert_language_story(result) -> None:
    """The story both language-model summaries tell, checked in the run's numbers."""
    runs = result.numbers["runs"]
    assert list(runs) == list(RUNS)
    fp32, none, static, dynamic, bf16, true16, truebf16 = runs.values()
    assert fp32["mean_underflow_fraction"] == 0
    assert all(r["skipped_steps"] == 0 for r in runs.values())
    # fp16 without scaling flushes the most gradient values; a scale fewer; bf16 none
    assert none["mean_underflow_fraction"] > static["mean_underflow_fraction"]
    assert bf16["mean_underflow_fraction"] == 0
    # ... and does not lag: every mixed run ends where fp32 does, above the entropy
    for r in (none, static, dynamic, bf16):
        assert abs(r["final_gap_to_fp32"]) < 1e-3
    assert fp32["final_gap_to_entropy"] > 0
    assert "does not lag" in result.summary
    # what it flushes lies in activation gradients; the parameters' own gradients keep nearly all
    assert max(none["parameter_gradient_underflow"].values()) < 0.001
    assert "activation gradients inside backward" in result.summary
    # the fine-tuning story: 16-true NaN from step 1 (eps 0 in fp16, v flushed), bf16-true trains
    diagnosis = result.numbers["diagnosis"]
    assert true16["first_nonfinite_step"] == 1 and true16["final_loss"] == "nan"
    assert diagnosis["adam_eps_in_fp16"] == 0 and diagnosis["adam_eps_in_bf16"] > 0
    assert diagnosis["16_true_moments_after_step_1"]["v_zero_m_nonzero"] > 0.5
    assert truebf16["first_nonfinite_step"] is None
    assert abs(truebf16["final_gap_to_fp32"]) < 0.01
    # without a master copy bf16 loses updates; the master-copy runs next to none
    assert truebf16["mean_lost_update_fraction"] > 0.005
    assert max(r["mean_lost_update_fraction"] for r in (fp32, none, static, dynamic, bf16)) \
        < 1e-4
    assert "NaN loss from step 1" in result.summary
    for label in runs:
        assert f"| {label} |" in result.table
