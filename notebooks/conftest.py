"""The lessons run under nbval (see pyproject's addopts), with sanitize.cfg beside this file
whatever directory pytest starts in. A lesson that needs PyTorch is skipped, with the reason,
where torch does not import."""
import importlib.util
from pathlib import Path

import pytest

NEEDS_TORCH = {"07_check_your_framework.ipynb"}
SANITIZERS = Path(__file__).resolve().parent / "sanitize.cfg"


def pytest_configure(config):
    if getattr(config.option, "nbval_sanitize_with", "missing") is None:
        config.option.nbval_sanitize_with = str(SANITIZERS)


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason="needs PyTorch (pip install -e '.[torch]'); not importable here")
    for item in items:
        if item.path.name in NEEDS_TORCH:
            item.add_marker(skip)
