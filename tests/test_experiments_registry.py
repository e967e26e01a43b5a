"""``reproduce`` keeps going past a broken experiment: the others run and are written, then
the failures are reported by name (``ExperimentsFailed``; the CLI exits 1)."""
from __future__ import annotations

import json

import pytest

from fpsim import experiments
from fpsim.cli import main
from fpsim.experiments import Experiment, ExperimentsFailed, Result


def _fine(ctx):
    (ctx.out / "fine.txt").write_text("ok\n")
    return Result("fine", "A fine experiment", {"answer": 42}, ["fine.txt"], "Fine.")


def _boom(ctx):
    raise ValueError("the data went missing")


@pytest.fixture
def fake_registry(monkeypatch):
    experiments.names()                                   # import the real ones first
    monkeypatch.setattr(experiments, "BROKEN", {})
    monkeypatch.setitem(experiments.REGISTRY, "fine", Experiment("fine", "A fine experiment",
                                                                 _fine))
    monkeypatch.setitem(experiments.REGISTRY, "boom", Experiment("boom", "Boom", _boom))
    real = experiments._module_names
    monkeypatch.setattr(experiments, "_module_names", lambda: real() + ["not_a_module"])


def test_failures_are_collected_and_the_rest_is_written(fake_registry, tmp_path):
    with pytest.raises(ExperimentsFailed) as info:
        experiments.reproduce(tmp_path, only=["boom", "not_a_module", "fine"])
    assert set(info.value.failures) == {"boom", "not_a_module"}
    assert "ValueError: the data went missing" in str(info.value)
    assert "import failed: ModuleNotFoundError" in info.value.failures["not_a_module"]
    assert info.value.done == ["fine"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["experiments"]) == ["fine"]
    assert (tmp_path / "fine.txt").read_text() == "ok\n"


def test_cli_lists_broken_modules_and_exits_1(fake_registry, tmp_path, capsys):
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "not_a_module" in listing and "import failed" in listing and "underflow" in listing
    code = main(["reproduce", "--only", "fine,boom", "--out", str(tmp_path), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err
    assert "1 experiment(s) failed" in err and "boom: ValueError" in err
    assert (tmp_path / "summary.md").exists()


def test_unknown_names_still_refused_before_anything_runs(fake_registry, tmp_path):
    with pytest.raises(ValueError, match="unknown experiment.*'nope'.*valid names"):
        experiments.reproduce(tmp_path / "out", only=["fine", "nope"])
    assert not (tmp_path / "out").exists()
