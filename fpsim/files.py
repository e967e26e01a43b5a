"""Files written whole or not at all: the one way fpsim writes an output file.

A writer gets an open temporary file in the destination's own folder; only when it returns
without error is the temporary renamed over the destination (``os.replace``, atomic on POSIX
and Windows within one file system). An interrupted or failing writer leaves the previous file
untouched and no temporary behind, so a figure, summary, trace or checkpoint on disk is always
one that was finished.

>>> import os, tempfile
>>> from pathlib import Path
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "summary.json")
>>> write_text(target, '{"ok": true}\\n')
>>> Path(target).read_text()
'{"ok": true}\\n'
>>> with atomic_file(target, "w") as handle:
...     _ = handle.write("half")
...     raise RuntimeError("interrupted")
Traceback (most recent call last):
RuntimeError: interrupted
>>> Path(target).read_text(), sorted(os.listdir(folder))
('{"ok": true}\\n', ['summary.json'])
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_file", "write_text", "write_bytes"]


@contextmanager
def atomic_file(path: "str | os.PathLike", mode: str = "wb", encoding: "str | None" = None):
    """Open a temporary file beside ``path`` for writing (``mode`` ``"w"`` or ``"wb"``); on a
    clean exit it replaces ``path`` atomically, on any exception (Ctrl-C included) it is
    removed and ``path`` keeps its old contents."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        if mode == "w":
            handle = os.fdopen(fd, "w", encoding=encoding or "utf-8", newline="")
        else:
            handle = os.fdopen(fd, "wb")
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def write_text(path: "str | os.PathLike", text: str) -> None:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically."""
    with atomic_file(path, "w") as handle:
        handle.write(text)


def write_bytes(path: "str | os.PathLike", data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_file(path, "wb") as handle:
        handle.write(data)
