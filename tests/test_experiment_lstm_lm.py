"""The LSTM language-model experiment's numbers (quick mode): pinned, telling the story its
summary tells, its figure the same bytes when drawn again; and the generated language it
shares with the transformer experiment: its rule and its entropy; the README and
docs/reproduce.md quote both language models' full runs (figures/summary.json)."""
import hashlib
import math

import numpy as np
import pytest

from fpsim.experiments import reproduce
from fpsim.experiments._language import (LENGTH, OFFSET_SIXTEENTHS, RUNS, VOCAB,
                                         entropy_nats, markov_source)
from fpsim.plots.language import plot_language
from language_story import assert_language_story
from pinned import assert_pinned
from quoted import full_run, paragraphs

PINNED = "37caecbc4488d2b9aceaed8ef53582550a071d4a8c6f4df67dd6b90fbc7318cb"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("lstm_lm")
    (result,) = reproduce(out, quick=True, only=["lstm_lm"])
    return out, result


def test_the_source_follows_its_rule_with_its_probabilities():
    data = markov_source()
    again = markov_source()
    assert np.array_equal(data.x, again.x) and np.array_equal(data.y, again.y)
    assert data.x.shape == data.y.shape == (2048, LENGTH)
    assert np.array_equal(data.x[:, 1:], data.y[:, :-1])         # labels: the next tokens
    # one successor per token; the offset from it is 0-3, as often as its sixteenths say
    successor = {}
    for current, following in zip(data.x.reshape(-1), data.y.reshape(-1)):
        successor.setdefault(int(current), set()).add(int(following))
    assert sorted(len(s) for s in successor.values()) == [4] * VOCAB
    # each token's followers are four consecutive ids (mod 16), from its successor on
    base = {c: next(t for t in s if {(t + k) % VOCAB for k in range(4)} == s)
            for c, s in successor.items()}
    assert sorted(base.values()) == list(range(VOCAB))             # a permutation
    offsets = [(int(f) - base[int(c)]) % VOCAB
               for c, f in zip(data.x.reshape(-1), data.y.reshape(-1))]
    share = np.bincount(offsets, minlength=4) / len(offsets)
    assert len(share) == 4
    assert np.allclose(share, np.array(OFFSET_SIXTEENTHS) / 16, atol=0.01)
    assert np.allclose(np.bincount(data.x.reshape(-1), minlength=VOCAB) / data.x.size,
                       1 / VOCAB, atol=0.01)


def test_entropy_is_one_and_three_quarter_bits():
    assert entropy_nats() == 1.75 * math.log(2)


def test_files_written(quick):
    out, result = quick
    assert sorted(p.name for p in out.iterdir()) == [
        "lstm_lm.png", "lstm_lm.svg", "summary.json", "summary.md", "timings.json",
        "timings.md"]
    assert result.figures == ["lstm_lm.png", "lstm_lm.svg"]


def test_figure_is_the_same_bytes_when_drawn_again(quick, tmp_path):
    out, result = quick
    n = result.numbers
    for path in plot_language(n["runs"], n["entropy_nats"], "LSTM LM", tmp_path / "lstm_lm"):
        assert hashlib.sha256(path.read_bytes()).digest() == \
            hashlib.sha256((out / path.name).read_bytes()).digest()


def test_runs_tell_the_summarys_story(quick):
    assert_language_story(quick[1])


def test_lstm_lm_numbers_pinned(quick):
    assert_pinned("lstm_lm", quick[1].numbers, PINNED)


def _gap(x: float) -> str:
    return f"{x:.2g}" if x < 1e-3 else f"{x:.4f}"


def test_the_readme_and_the_reproduce_page_quote_both_language_models_full_runs():
    """One paragraph quotes the LSTM's number, then the transformer's, in pairs."""
    lstm, transformer = full_run("lstm_lm"), full_run("transformer_lm")
    # summary.json sorts its keys: the runs by label, not in RUNS order
    fp32, none, static, dynamic, bf16, true16, truebf16 = (
        (lstm["runs"][label], transformer["runs"][label]) for label in RUNS)
    moments = [n["diagnosis"]["16_true_moments_after_step_1"]["v_zero_m_nonzero"]
               for n in (lstm, transformer)]
    quoted = [f"fp32 gets to {fp32[0]['final_loss']:.4f} (LSTM) and "
              f"{fp32[1]['final_loss']:.4f} (transformer)",
              f"flushes {100 * none[0]['mean_underflow_fraction']:.2g}% (LSTM, rising to "
              f"{100 * none[0]['final_underflow_fraction']:.2g}% as it fits) and "
              f"{100 * none[1]['mean_underflow_fraction']:.2g}% of the nonzero",
              f"({none[0]['final_loss']:.4f} and {none[1]['final_loss']:.4f}; typical gap to "
              f"fp32 {_gap(none[0]['typical_gap_to_fp32'])} and "
              f"{_gap(none[1]['typical_gap_to_fp32'])}, a scale of 128's "
              f"{_gap(static[0]['typical_gap_to_fp32'])} and "
              f"{_gap(static[1]['typical_gap_to_fp32'])}, bf16-mixed's "
              f"{_gap(bf16[0]['typical_gap_to_fp32'])} and {_gap(bf16[1]['typical_gap_to_fp32'])}",
              f"not in {100 * moments[0]:.1f}% and {100 * moments[1]:.1f}% of the entries",
              f"bf16-true trains ({truebf16[0]['final_loss']:.4f} and "
              f"{truebf16[1]['final_loss']:.4f}), losing "
              f"{100 * truebf16[0]['mean_lost_update_fraction']:.1f}% and "
              f"{100 * truebf16[1]['mean_lost_update_fraction']:.1f}% of its updates"]
    # what the paragraph concludes from them: no skipped step, 16-true NaN from step 1
    assert all(r["skipped_steps"] == 0 for r in dynamic)
    assert all(r["first_nonfinite_step"] == 1 for r in true16)
    for page, paragraph in paragraphs("**Language models** (the paper's").items():
        for phrase in quoted:
            assert phrase in paragraph, (page, phrase)
