"""Files written whole or not at all: the one way fpsim writes an output file.

A writer gets an open temporary file in the destination's own folder; only when it returns
without error is the temporary renamed over the destination (``os.replace``, atomic on POSIX
and Windows within one file system). An interrupted or failing writer leaves the previous file
untouched and no temporary behind, so a figure, summary, trace or checkpoint on disk is always
one that was finished.

``folder_lock`` keeps two processes from writing one output folder at once.

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
import re
import secrets
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "write_text", "write_bytes", "folder_lock", "FolderInUse",
           "LOCK_NAME", "naming_file", "remove_stale_temporaries"]

LOCK_NAME = ".fpsim.lock"
_BINARY = getattr(os, "O_BINARY", 0)     # Windows: no newline translation
_TOKEN_BYTES = 6
# atomic_file's temporaries, and only they: ".NAME.<12 hex digits>.tmp"
_TEMPORARY = re.compile(rf"\..+\.[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.tmp")


@contextmanager
def atomic_file(path: "str | os.PathLike", mode: str = "wb", encoding: "str | None" = None):
    """Open a temporary file beside ``path`` for writing (``mode`` ``"w"`` or ``"wb"``); on a
    clean exit it replaces ``path`` atomically, on any exception (Ctrl-C included) it is
    removed and ``path`` keeps its old contents."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    # The name is chosen before the file exists, so that a Ctrl-C arriving at any point after
    # it is created (even inside the call that creates it) still finds it to remove.
    temp_name = directory / f".{path.name}.{secrets.token_hex(_TOKEN_BYTES)}.tmp"
    with naming_file(path):     # a full disk's error names the file it stopped
        try:
            fd = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, 0o644)
            handle: IO
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


class FolderInUse(ValueError):
    """Another process holds the folder's lock: says which process and what to do."""


@contextmanager
def folder_lock(folder: "str | os.PathLike"):
    """Hold ``folder/.fpsim.lock`` while writing into ``folder``; yields a note (a string) when
    a stale lock was taken over, else None.

    The lock file is created with ``O_CREAT | O_EXCL`` (so exactly one process can create it)
    and holds ``PID HOST``; it is removed on exit, exceptions and Ctrl-C included. A process
    killed outright leaves it behind: a lock whose process no longer runs on this host is
    stale and taken over, with a note saying so. A lock held by a running process, from
    another host, or unreadable, raises ``FolderInUse`` naming the process and the file.
    (Two processes taking over the same stale lock at the same instant can both succeed;
    outside that, the second writer is refused.)"""
    path = Path(folder) / LOCK_NAME
    note = None
    for attempt in (1, 2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            owner = _lock_owner(path)
            if attempt == 1 and owner is not None and _is_dead(*owner):
                path.unlink(missing_ok=True)
                note = (f"took over the stale lock {path} of process {owner[0]}, which no longer "
                        f"runs (it was stopped without cleaning up)")
                continue
            holder = (f"process {owner[0]} on {owner[1]}" if owner is not None
                      else "another process (the lock file does not say which)")
            raise FolderInUse(f"{folder} is being written by {holder}: wait for it to finish, or, "
                              f"if no fpsim runs there, delete {path}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {socket.gethostname()}\n")
        yield note
    finally:
        path.unlink(missing_ok=True)


def _lock_owner(path: Path) -> "tuple[int, str] | None":
    try:
        pid, host = path.read_text(encoding="utf-8").split()
        return int(pid), host
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _is_dead(pid: int, host: str) -> bool:
    """Whether process ``pid`` of ``host`` is known not to run (only this host's can be
    checked, and only on POSIX: signal 0 tests for a process without touching it)."""
    if host != socket.gethostname() or os.name != "posix" or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:         # PermissionError: it runs, as another user
        return False
    return False


@contextmanager
def naming_file(path: "str | os.PathLike"):
    """Within: an ``OSError`` that names no file is raised again naming ``path``. A write to a
    full disk (``os.write`` on a descriptor) says only "No space left on device"."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


def remove_stale_temporaries(folder: "str | os.PathLike") -> list[str]:
    """Delete the temporaries ``atomic_file`` left in ``folder`` when its process was killed
    outright (kill -9, power loss), and return their names; no other file is touched. Call it
    only while holding the folder's lock, so that no writer of ours is using one."""
    removed = []
    for entry in sorted(Path(folder).iterdir()):
        if _TEMPORARY.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
