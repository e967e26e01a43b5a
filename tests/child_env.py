"""The environment of a Python process a test starts: this checkout first on PYTHONPATH and
whatever was there after it, so that packages which reach Python only through PYTHONPATH
(the wheels ``.ci/device-check`` carries to the GPU image) reach the child too."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict:
    """``os.environ`` with the checkout put first on PYTHONPATH, and ``extra`` set."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != str(ROOT)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *kept]), **extra)
