"""The lessons run under nbval (see pyproject's addopts). A lesson that needs PyTorch is
skipped, with the reason, where torch does not import."""
import importlib.util

import pytest

NEEDS_TORCH = {"07_check_your_framework.ipynb"}


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("torch") is not None:
        return
    skip = pytest.mark.skip(reason="needs PyTorch (pip install -e '.[torch]'); not importable here")
    for item in items:
        if item.path.name in NEEDS_TORCH:
            item.add_marker(skip)
