"""The fp4 experiment (quick mode): NVFP4 with each ingredient off, beside bf16 and MXFP4;
pinned, telling the story its summary tells; the README's paragraph and docs/reproduce.md's
quote the full run's figures/summary.json."""
import hashlib
import math

import pytest

from fpsim.experiments import reproduce
from fpsim.experiments.fp4 import CASTS, SEPARATES, summary
from fpsim.plots.fp4 import plot_fp4
from pinned import assert_pinned
from quoted import full_run, paragraphs

PINNED = "2e7d97b7466dcf7f27517e6137a8be159d35329076d7fa83317e0ed00e5880a1"
NVFP4_LOSSES = "43e5e881aea9fe58e0348735c8f88ba681aca8b40aade4dd236c986e8b592a90"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp4")
    (result,) = reproduce(out, quick=True, only=["fp4"])
    return out, result


def test_files_written_and_figure_drawn_again_the_same(quick, tmp_path):
    out, result = quick
    assert sorted(p.name for p in out.iterdir()) == [
        "fp4.png", "fp4.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    n = result.numbers
    for path in plot_fp4(n["runs"], "bf16-mixed", CASTS, n["head_gradient_rounding"],
                         tmp_path / "fp4"):
        assert hashlib.sha256(path.read_bytes()).digest() == \
            hashlib.sha256((out / path.name).read_bytes()).digest()


def _ratio(runs, label):
    return runs[label]["typical_gap_to_bf16"] / runs["NVFP4"]["typical_gap_to_bf16"]


def test_the_runs_tell_the_summarys_story(quick):
    out, result = quick
    runs, rounding = result.numbers["runs"], result.numbers["head_gradient_rounding"]
    assert runs["NVFP4"]["loss_sha256"] == NVFP4_LOSSES
    for label, run in runs.items():       # every recipe trains, near bf16
        assert all(math.isfinite(v) for v in run["losses"]), label
        assert run["typical_gap_to_bf16"] < 0.05, label
    # keeping the read-out in bf16 is what matters here: its gradient cast flushes most
    assert _ratio(runs, "read-out in FP4 too") >= SEPARATES
    head = runs["read-out in FP4 too"]["flushed_by_role_in_head"]["grad_output"]
    assert head > 3 * runs["NVFP4"]["flushed_by_role_in_block"]["grad_output"]
    assert runs["NVFP4"]["flushed_by_role_in_head"]["grad_output"] == "nan"   # kept in bf16
    # nearest even shrinks the gradient's small values; stochastic rounding does not
    assert rounding["nearest_even"]["positive_part_kept"] < 0.97
    assert abs(rounding["stochastic"]["positive_part_kept"] - 1) < 0.02
    # the transform cuts the wgrad casts' flushed values; 2-D tiles flush more weights
    on, rht = (runs[k]["flushed_by_role_in_block"] for k in ("NVFP4", "no Hadamard transform"))
    assert rht["wgrad_grad_output"] > 1.5 * on["wgrad_grad_output"]
    assert on["weight"] > runs["1x16 weight blocks"]["flushed_by_role_in_block"]["weight"]
    mx = runs["MXFP4"]["flushed_by_role_in_block"]
    assert mx["wgrad_input"] == "nan" and mx["input"] > on["input"]
    text = (out / "summary.md").read_text()
    assert summary(result.numbers) in text and "only 'read-out in FP4 too' moves" in text


def test_fp4_numbers_pinned(quick):
    assert_pinned("fp4", quick[1].numbers, PINNED)


def test_readme_quotes_the_full_runs_numbers():
    """The README and docs/reproduce.md quote the full run's gaps and statistics, and its
    conclusion: no single ingredient moves the loss to SEPARATES times NVFP4's own gap."""
    n = full_run("fp4")
    runs = n["runs"]
    gaps = {label: runs[label]["typical_gap_to_bf16"] for label in runs}
    ratios = {label: gap / gaps["NVFP4"] for label, gap in gaps.items()}
    movers = [label for label, ratio in ratios.items() if ratio >= n["separates"]]
    assert movers == ["every ingredient off"]
    head = runs["read-out in FP4 too"]["flushed_by_role_in_head"]["grad_output"]
    worst = max(cast["flushed"] for cast in runs["read-out in FP4 too"]["casts"].values())
    assert head == worst
    rounding = n["head_gradient_rounding"]
    rht = runs["no Hadamard transform"]["flushed_by_role_in_block"]["wgrad_grad_output"]
    on = runs["NVFP4"]["flushed_by_role_in_block"]["wgrad_grad_output"]
    for page, paragraph in paragraphs("**FP4 recipes** (TE's NVFP4").items():
        assert f"{n['steps']} steps" in paragraph, page
        for label in ("NVFP4", "no Hadamard transform", "no stochastic rounding",
                      "1x16 weight blocks", "read-out in FP4 too", "every ingredient off",
                      "MXFP4"):
            assert f"{gaps[label]:.4f}" in paragraph, (page, label)
        assert ("all under twice NVFP4's own gap: at this size no single ingredient moves the "
                "loss, only every ingredient off together does") in paragraph, page
        assert f"{100 * head:.1f}% of its nonzero values flush to zero in FP4, the worst cast" \
            in paragraph, page
        for share in (rounding["nearest_even"]["positive_part_kept"],
                      rounding["stochastic"]["positive_part_kept"], rht, on):
            assert f"{100 * share:.1f}%" in paragraph, page
