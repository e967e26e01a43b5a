"""pytest hooks for the notebooks: a lesson whose optional dependency is missing is skipped
with the reason, instead of failing because its saved outputs (made with the dependency)
differ from the notes its cells print without it."""
from __future__ import annotations

import importlib

import pytest

# notebook file name -> (module it needs, how to install it)
REQUIRES = {
    "07_check_your_framework.ipynb": ("torch", "pip install torch==2.13.0"),
}


def _missing(module: str) -> str | None:
    """None if ``module`` imports, else the error (an installed but broken module counts as
    missing: the notebook's own ``import`` would fail the same way)."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        return str(err) or type(err).__name__
    return None


def pytest_collection_modifyitems(config, items):
    checked: dict[str, str | None] = {}
    for item in items:
        need = REQUIRES.get(item.path.name)
        if need is None:
            continue
        module, install = need
        if module not in checked:
            checked[module] = _missing(module)
        if checked[module] is not None:
            item.add_marker(pytest.mark.skip(
                reason=f"{item.path.name} needs {module} ({install}): {checked[module]}"))
