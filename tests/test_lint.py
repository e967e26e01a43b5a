"""Lint and types as CI runs them (``.ci/run``): ``ruff check`` and ``mypy`` with their
configuration in pyproject.toml. Each runs when the release the ``lint`` extra pins is installed
(``pip install -e ".[lint]"``) and skips with the reason otherwise: another release finds other
things. mypy, with an empty cache in a temporary folder, takes ~10 s (the optional libraries are
not analysed: pyproject.toml), ruff well under one."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pinned_versions() -> dict[str, str]:
    """The ``lint`` extra's pins, name -> version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = (entry.split("==") for entry in project["optional-dependencies"]["lint"])
    return {name: version for name, version in pins}


def require_pinned(tool: str) -> None:
    """Skip, saying why, unless the pinned release of ``tool`` is installed."""
    wanted = pinned_versions()[tool]
    try:
        installed = importlib.metadata.version(tool)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{tool} is not installed (pip install -e '.[lint]' installs {tool} {wanted})")
    if installed != wanted:
        pytest.skip(f"{tool} {installed} is installed; the lint extra pins {wanted}, whose "
                    f"findings CI checks (pip install -e '.[lint]')")


def run_tool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_pinned_versions_are_exact():
    assert set(pinned_versions()) == {"ruff", "mypy"}


def test_ruff_finds_nothing():
    require_pinned("ruff")
    done = run_tool("ruff", "check", "--no-cache", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow      # ~11 s; CI runs mypy as a step of its own (.ci/run), before the tests
def test_mypy_finds_nothing(tmp_path):
    require_pinned("mypy")
    done = run_tool("mypy", "--cache-dir", str(tmp_path / "mypy_cache"))
    assert done.returncode == 0, done.stdout + done.stderr
