from pathlib import Path

import pytest

import engine_reruns
from fpsim import backend

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTFLOAT_DIR = REPO_ROOT.parent / "shared" / "testfloat"


@pytest.fixture(scope="session")
def testfloat_dir() -> Path:
    """The Berkeley TestFloat vectors (../shared/testfloat beside the repository)."""
    if not TESTFLOAT_DIR.is_dir():
        pytest.skip(f"TestFloat vectors not found at {TESTFLOAT_DIR}: the project's machines "
                    f"have them beside the repository; elsewhere, generate them with Berkeley "
                    f"TestFloat 3's testfloat_gen (level 1, one file per function and rounding "
                    f"mode, <function>.<rounding>.txt.gz: tests/test_testfloat.py says which)")
    return TESTFLOAT_DIR


def pytest_collection_modifyitems(config, items):
    """Under FPSIM_BACKEND=numpy-strict (or another backend) the engine tests run as they are,
    except those marked numpy_only (NumPy's reprs in doctest output, NumPy-only internals) or
    host_only (a CLI's exit status and files: the same on every backend, checked once)."""
    if backend.name() == "numpy":
        return
    for item in items:
        for marker in ("numpy_only", "host_only"):
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(
                    reason=f"{marker}: not run on backend {backend.name()!r}"))


def pytest_collection_finish(session):
    """Start the engine-test reruns under other backends that this NumPy session will check,
    so that they run beside it on the second core (``engine_reruns``)."""
    if backend.name() != "numpy":
        return
    engine_reruns.start([engine_reruns.RERUN_TESTS[item.name] for item in session.items
                         if item.name in engine_reruns.RERUN_TESTS])


def pytest_sessionfinish(session):
    engine_reruns.stop()
