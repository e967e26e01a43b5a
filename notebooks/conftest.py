"""The lessons run under nbval (see pyproject's addopts), with sanitize.cfg beside this file
whatever directory pytest starts in, and a kernel that imports this checkout's fpsim (its root
goes first on the kernel's PYTHONPATH, so an fpsim installed elsewhere is not the one
tested). A lesson that needs PyTorch is skipped, with the reason,
where torch does not import. The exercise versions in exercises/ are not collected: they raise
NotImplementedError by design (tests/test_notebooks.py checks them instead)."""
import os
from pathlib import Path

import pytest

NEEDS_TORCH = {"07_check_your_framework.ipynb"}
SANITIZERS = Path(__file__).resolve().parent / "sanitize.cfg"
REPO_ROOT = str(Path(__file__).resolve().parents[1])
collect_ignore = ["exercises"]


def pytest_configure(config):
    # the kernel is a subprocess: it sees the environment, not this process's sys.path
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[0] != REPO_ROOT:
        os.environ["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in paths if p])
    if getattr(config.option, "nbval_sanitize_with", "missing") is None:
        config.option.nbval_sanitize_with = str(SANITIZERS)


def torch_missing() -> str | None:
    """Why torch cannot be used here, or None when it imports."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        return f"{type(error).__name__}: {error}"
    return None


def pytest_collection_modifyitems(config, items):
    needing = [item for item in items if item.path.name in NEEDS_TORCH]
    why = torch_missing() if needing else None
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"needs PyTorch (pip install -e '.[torch]'), which does not "
                                   f"import here ({why})")
    for item in needing:
        item.add_marker(skip)
