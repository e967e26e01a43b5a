from pathlib import Path

import pytest

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
