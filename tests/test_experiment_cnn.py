"""The CNN experiment's numbers (quick mode): pinned, telling the story its summary tells, and
its figure the same bytes when drawn again from the same numbers; the README and
docs/reproduce.md quote the full run's (figures/summary.json)."""
import hashlib

import numpy as np
import pytest

from fpsim.experiments import reproduce
from fpsim.experiments.cnn import (LAYERS, RUNS, ResidualCNN, images,
                                   record_activation_gradients, what_is_lost)
from fpsim.plots.cnn import plot_cnn
from pinned import assert_pinned
from quoted import full_run, paragraphs

PINNED = "76555fd25a574f909c2d549d8223dd29e2bc6e0de4099cf6766d70ea8ef9a4f8"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn")
    (result,) = reproduce(out, quick=True, only=["cnn"])
    return out, result


def test_files_written(quick):
    out, result = quick
    assert sorted(p.name for p in out.iterdir()) == [
        "cnn.png", "cnn.svg", "summary.json", "summary.md", "timings.json", "timings.md"]
    assert result.figures == ["cnn.png", "cnn.svg"]


def test_figure_is_the_same_bytes_when_drawn_again(quick, tmp_path):
    out, result = quick
    n = result.numbers
    again = plot_cnn(n["gradients_at_init"], n["gradients_after_fp32_training"], n["runs"],
                     n["layers"], tmp_path / "cnn")
    for path in again:
        assert hashlib.sha256(path.read_bytes()).digest() == \
            hashlib.sha256((out / path.name).read_bytes()).digest()


def test_underflow_grows_as_the_network_fits(quick):
    _, result = quick
    init = result.numbers["gradients_at_init"]
    done = result.numbers["gradients_after_fp32_training"]
    assert len(done["layer_lost_of_nonzero"]) == len(LAYERS)
    # small from the start (most values fp16 subnormals), lost once the network fits
    assert init["fractions"]["subnormal_of_nonzero"] > 0.5
    assert init["fractions"]["lost_of_nonzero"] < 0.01 < 0.1 < done["fractions"]["lost_of_nonzero"]
    assert all(d > i for i, d in zip(init["layer_lost_of_nonzero"],
                                     done["layer_lost_of_nonzero"]))
    # what is lost: fit samples' values, carrying almost none of the gradients' magnitude
    assert done["lost_values_from_fit_samples"] > 0.9 > done["fit_samples"]
    assert done["lost_share_of_gradient_magnitude"] < 0.01
    recovered = [done["fractions"]["by_scale"][s]["recovered_of_lost"]
                 for s in ("8", "128", "32768")]
    assert 0 < recovered[0] < recovered[1] < recovered[2]


def test_runs_tell_the_summarys_story(quick):
    _, result = quick
    runs = result.numbers["runs"]
    assert list(runs) == list(RUNS)
    fp32, none, static, dynamic, bf16 = runs.values()
    assert fp32["mean_underflow_fraction"] == 0 and fp32["skipped_steps"] == 0
    # fp16 without scaling flushes the most gradient values; a scale or bf16's range fewer
    assert none["final_underflow_fraction"] > static["final_underflow_fraction"] \
        > bf16["final_underflow_fraction"]
    for r in (none, static, bf16):      # the summary's measure: the typical gap (quick mode's
        # final loss is one batch's, so its gap to fp32 is that batch's noise, a few 0.01)
        assert r["typical_gap_to_fp32"] < 1e-3 and abs(r["final_gap_to_fp32"]) < 0.05
        assert r["skipped_steps"] == 0
    assert dynamic["skipped_steps"] == len(dynamic["skipped_at"])
    # fp32 master weights: next to no update lost to rounding, as the summary says
    assert max(r["mean_lost_update_fraction"] for r in runs.values()) < 1e-3
    assert "next to no update" in result.summary
    assert "does not lag" in result.summary
    for label in runs:
        assert f"| {label} |" in result.table


def test_lost_values_are_split_by_fit_samples():
    # one fit sample (error 2**-9) whose values are all tiny, one unfit sample
    logits = np.float32([[2.0 ** -9 / 64, -2.0 ** -9 / 64], [-0.25 / 64, 0.25 / 64]])
    conv = np.float32([[2.0 ** -30, 2.0 ** -26], [2.0 ** -26, 2.0 ** -10]])
    found = what_is_lost([conv, logits])
    assert found["fit_samples"] == 0.5
    assert found["lost_values_from_fit_samples"] == 2 / 3


def test_recorded_gradients_are_deterministic():
    data = images()
    first = record_activation_gradients(ResidualCNN(), data, batches=1)
    second = record_activation_gradients(ResidualCNN(), data, batches=1)
    assert [g.shape[0] for g in first] == [64] * len(LAYERS)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_cnn_numbers_pinned(quick):
    assert_pinned("cnn", quick[1].numbers, PINNED)


def test_the_readme_and_the_reproduce_page_quote_the_full_runs_numbers():
    n = full_run("cnn")
    init, done = n["gradients_at_init"], n["gradients_after_fp32_training"]
    runs = n["runs"]       # summary.json sorts its keys: the runs by label, not in RUNS order
    fp32, none, static, dynamic, bf16 = (runs[label] for label in RUNS)
    peak = max(range(len(bf16["losses"])), key=bf16["losses"].__getitem__)
    skipped = " and ".join(map(str, dynamic["skipped_at"]))
    quoted = [f"{100 * init['fractions']['subnormal_of_nonzero']:.1f}% are fp16 subnormals",
              f"{100 * done['fractions']['lost_of_nonzero']:.1f}% round to zero",
              f"{100 * done['lost_values_from_fit_samples']:.1f}% of those belong",
              f"carry {100 * done['lost_share_of_gradient_magnitude']:.2f}% of the gradients'",
              f"{none['final_loss']:.4f} against fp32's {fp32['final_loss']:.4f}",
              f"a typical gap of {none['typical_gap_to_fp32']:.4f} (a static scale of 128: "
              f"{static['typical_gap_to_fp32']:.4f})",
              f"strays furthest (typical gap {bf16['typical_gap_to_fp32']:.4f})",
              f"jumps to {bf16['losses'][peak]:.2f} at step {peak} and is back to "
              f"{bf16['final_loss']:.4f}",
              f"skips steps {skipped}, backs off to {dynamic['final_scale']:g}",
              f"(typical gap {dynamic['typical_gap_to_fp32']:.4f}, final loss "
              f"{dynamic['final_loss']:.4f})"]
    # the words drawn from the numbers: bf16-mixed strays furthest of all the runs
    assert bf16["typical_gap_to_fp32"] == max(r["typical_gap_to_fp32"] for r in runs.values())
    for page, paragraph in paragraphs("**CNN** (Fig. 3").items():
        for phrase in quoted:
            assert phrase in paragraph, (page, phrase)
