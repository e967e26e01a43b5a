"""Execute every lesson in place so its saved outputs are current: ``python notebooks/refresh.py``
(or name some: ``python notebooks/refresh.py 03_loss_scaling.ipynb``).

Deterministic on purpose: the installed ``python3`` kernel, the working directory
``notebooks/`` (as nbval uses), and no volatile metadata (per-cell execution timestamps), so
refreshing unchanged notebooks leaves ``git diff`` empty. The kernel imports this checkout's
fpsim: its root is put first on the kernel's PYTHONPATH, as notebooks/conftest.py does for
the tests.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNEL = "python3"
TIMEOUT_S = 120


def refresh(path: Path) -> float:
    """Run one notebook top to bottom, write it back with its outputs, return the seconds taken."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, kernel_name=KERNEL, timeout=TIMEOUT_S,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = join_streams(cell.outputs)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": KERNEL}
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return seconds


def join_streams(outputs: list) -> list:
    """Consecutive stdout (stderr) chunks as one output: how the kernel splits a stream between
    messages varies from run to run, and would change the saved file with nothing changed."""
    joined: list = []
    for out in outputs:
        last = joined[-1] if joined else None
        if (out.output_type == "stream" and last is not None
                and last.output_type == "stream" and last.name == out.name):
            last.text += out.text
        else:
            joined.append(out)
    return joined


def main(argv: list[str]) -> int:
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in paths if p != str(ROOT)])
    paths = [HERE / name for name in argv] or sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path.name}: {refresh(path):.1f} s, {path.stat().st_size / 1024:.0f} KB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
