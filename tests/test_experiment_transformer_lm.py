"""The transformer language-model experiment's numbers (quick mode): pinned, telling the
story its summary tells, its figure the same bytes when drawn again (the generated language
is tested with the LSTM experiment's)."""
import hashlib
import pytest

from fpsim.experiments import reproduce
from fpsim.plots.language import plot_language
from language_story import assert_language_story
from pinned import assert_pinned

PINNED = "464fb41bc420e68fbb41a4c13658495a7e87fc797c161544ddc0f8fad0a9997c"


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
    assert_language_story(quick[1])


def test_transformer_lm_numbers_pinned(quick):
    assert_pinned("transformer_lm", quick[1].numbers, PINNED)
