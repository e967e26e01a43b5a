from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTFLOAT_DIR = REPO_ROOT.parent / "shared" / "testfloat"


@pytest.fixture(scope="session")
def testfloat_dir() -> Path:
    """The Berkeley TestFloat vectors (../shared/testfloat beside the repository)."""
    if not TESTFLOAT_DIR.is_dir():
        pytest.skip(f"TestFloat vectors not found at {TESTFLOAT_DIR} (they ship beside the "
                    f"repository in ../shared/testfloat)")
    return TESTFLOAT_DIR
