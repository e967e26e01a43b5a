"""Experiment 1's numbers (quick mode): pinned, and telling the story the summary tells; the
full run's, as the README and docs/reproduce.md quote them."""
import json
from pathlib import Path

import numpy as np

from fpsim.experiments import reproduce
from pinned import assert_pinned
from fpsim.experiments.underflow import activation_gradients, exponent_histogram, judge

PINNED = "df0625bb09b3fba658a0649dee28992526398d3f0e93d9079f6d9da57fd8d4a7"


def test_judge_uses_fp16s_exact_boundaries():
    g = np.float32([0.0, 2.0 ** -25, 2.0 ** -25 * 1.5, 2.0 ** -24, 2.0 ** -15, 2.0 ** -14,
                    -2.0 ** -30, 2.0 ** -12])
    verdict = judge(g, scales=(8, 32768))
    counts = verdict["counts"]
    # 2**-25 ties to zero; 1.5 * 2**-25 rounds up to 2**-24; 2**-14 is fp16's smallest normal
    assert (counts["zero_in_fp32"], counts["lost_in_fp16"], counts["subnormal"],
            counts["normal"]) == (1, 2, 3, 2)
    assert counts["in_band_2^-27_2^-24"] == 2
    assert counts["by_scale"]["8"] == {"recovered": 1, "still_lost": 1, "overflow": 0}
    # 2**-12 * 32768 = 8 fits; nothing here overflows, and 2**-30 * 32768 = 2**-15 is kept
    assert counts["by_scale"]["32768"] == {"recovered": 2, "still_lost": 0, "overflow": 0}
    big = judge(np.float32([4.0, 2.0 ** -26]), scales=(32768,))["counts"]["by_scale"]["32768"]
    assert big == {"recovered": 1, "still_lost": 0, "overflow": 1}


def test_histogram_bins_by_exact_binary_exponent():
    hist = exponent_histogram(np.float32([0.0, 1.0, 1.9999999, 2.0, -0.75, 2.0 ** -30]))
    assert hist["exponents"][0] == -30 and hist["exponents"][-1] == 1
    assert dict(zip(hist["exponents"], hist["counts"]))[0] == 2
    assert dict(zip(hist["exponents"], hist["counts"]))[-1] == 1
    assert sum(hist["counts"]) == 5


def test_underflow_numbers(tmp_path):
    (result,) = reproduce(tmp_path, quick=True, only=["underflow"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "summary.json", "summary.md", "timings.json", "timings.md", "underflow_histogram.png",
        "underflow_histogram.svg"]
    f = result.numbers["fractions"]
    scales = f["by_scale"]
    # the gradients straddle fp16's lower limit: some normal, many subnormal, many lost
    assert f["normal_of_nonzero"] > 0.1 and f["subnormal_of_nonzero"] > 0.2
    assert f["lost_of_nonzero"] > 0.3
    assert f["zero_in_fp16"] > f["zero_in_fp32"] > 0.3
    # larger scales recover more; 32768 nearly all (NVIDIA: all but ~0.1%), none overflow
    recovered = [scales[s]["recovered_of_lost"] for s in ("8", "128", "32768")]
    assert 0 < recovered[0] < recovered[1] < recovered[2] and recovered[2] > 0.99
    assert all(scales[s]["overflow_of_nonzero"] == 0 for s in scales)
    # the first layer's median gradient is lost in fp16, the last hidden layer's is normal
    quantiles = result.numbers["layer_abs_quantiles_10_50_90"]
    assert quantiles[0][1] < 2.0 ** -25 and quantiles[-2][1] >= 2.0 ** -14
    counts = result.numbers["counts"]
    assert sum(result.numbers["histogram"]["counts"]) == counts["values"] - counts["zero_in_fp32"]
    assert_pinned("underflow", result.numbers, PINNED)


def test_activation_gradients_are_the_experiments_data(tmp_path):
    """The public entry point the lesson uses gives the very values the experiment judged."""
    (result,) = reproduce(tmp_path, quick=True, only=["underflow"])
    per_layer = activation_gradients()
    assert len(per_layer) == len(result.numbers["layers"])
    assert judge(np.concatenate(per_layer))["counts"] == result.numbers["counts"]


def test_the_readme_and_the_reproduce_page_quote_the_full_runs_numbers():
    """The README's picture and docs/reproduce.md carry one caption; its numbers are the full
    run's (figures/summary.json)."""
    root = Path(__file__).resolve().parents[1]
    full = json.loads((root / "figures" / "summary.json").read_text())
    fractions = full["experiments"]["underflow"]["numbers"]["fractions"]
    by_scale = fractions["by_scale"]
    quoted = [f"{100 * fractions['lost_of_nonzero']:.1f}% round to zero in fp16",
              f"another {100 * fractions['subnormal_of_nonzero']:.1f}% survive only as subnormals",
              f"a loss scale of 8 recovers {100 * by_scale['8']['recovered_of_lost']:.1f}%",
              f"128 recovers {100 * by_scale['128']['recovered_of_lost']:.1f}%",
              f"32768 all but {100 * by_scale['32768']['still_lost_of_nonzero']:.2f}%"]
    for page in (root / "README.md", root / "docs" / "reproduce.md"):
        text = " ".join(page.read_text().split())
        for phrase in quoted:
            assert phrase in text, (page.name, phrase)
