"""Experiment 7's numbers (quick mode): pinned, and telling the story the summary tells."""

from fpsim.experiments import reproduce
from pinned import assert_pinned

PINNED = "5a21294f7f42af13711a92bd8b73b28e98cd0db736aee3e03532606188529e98"


def test_accumulation_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["accumulation"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "accumulation_error.png", "accumulation_error.svg", "summary.json", "summary.md",
        "timings.json", "timings.md"]
    positive = result.numbers["median_relative_error"]["positive (like sums of probabilities)"]
    fp16, fp32 = positive["fp16 accumulate"], positive["fp32 accumulate"]
    exact = positive["exact, rounded once to fp32"]
    assert fp16[-1] > 100 * fp16[0] and fp16[-1] > 1e-2          # fp16 accumulation degrades
    assert all(e < 2.0 ** -24 * 2 for e in exact)                 # one rounding, nothing more
    assert all(b < a for a, b in zip(fp16, fp32))
    assert_pinned("accumulation", result.numbers, PINNED)
