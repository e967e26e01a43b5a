"""The transformer language-model experiment's numbers (quick mode): pinned, telling the
story its summary tells, its figure the same bytes when drawn again (the generated language
is tested with the LSTM experiment's)."""
import hashlib
import pytest

from fpsim.experiments import reproduce
from fpsim.experiments._language import RUNS
from fpsim.plots.language import plot_language
from pinned import assert_pinned

PINNED = "9a4affa20f6955abb4cf2da65844cf1224b968114718d493e77ce82d68b1c926"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("transformer_lm")
    (result,) = reproduce(out, quick=True, only=["transformer_lm"])
    return out, result


def test_files_written(quick):
    out, result = quick
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "transformer_lm.png", "transformer_lm.svg", "summary.json", "summary.md",
        "timings.json", "timings.md"])
    assert result.figures == ["transformer_lm.png", "transformer_lm.svg"]


def test_figure_is_the_same_bytes_when_drawn_again(quick, tmp_path):
    out, result = quick
    n = result.numbers
    for path in plot_language(n["runs"], n["entropy_nats"], "Transformer LM",
                              tmp_path / "transformer_lm"):
        assert hashlib.sha256(path.read_bytes()).digest() == \
            hashlib.sha256((out / path.name).read_bytes()).digest()


def test_runs_tell_the_summarys_story(quick):
    _, result = quick
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


def test_transformer_lm_numbers_pinned(quick):
    assert_pinned("transformer_lm", quick[1].numbers, PINNED)
