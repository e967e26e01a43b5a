"""Replacing a finished run without risking it, and tidying what a killed run left behind.

``train(overwrite=True)`` (``fpsim train --overwrite``) into a folder that holds a run builds
the new run in a hidden folder inside it, ``.fpsim-new-<token>``, and swaps it in only once it
is complete: the old run's files move aside into ``.fpsim-old-<token>``, the hidden folder is
renamed ``.fpsim-in-<token>``, its files move in, and the old ones are deleted. Each move is a
rename within one file system, which needs no disk space, so a full disk, an error or Ctrl-C
before the swap leaves the old run exactly as it was, and the error says so.

A process killed outright (kill -9, power loss) leaves these folders, and ``atomic_file``'s
temporaries, behind; ``tidy_run_folder`` (run under the folder's lock before each run there)
settles them: an unfinished new run is deleted; a swap stopped while the old files moved aside
is undone; one stopped once the new run was moving in (``.fpsim-in-``) is completed.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from ..files import remove_stale_temporaries

__all__ = ["replacing_run", "tidy_run_folder"]

NEW, MOVING_IN, OLD = ".fpsim-new-", ".fpsim-in-", ".fpsim-old-"
_OURS = re.compile(r"\.fpsim-(new|in|old)-([0-9a-f]{12})")


@contextmanager
def replacing_run(out_dir: Path, old_names: "list | None"):
    """Yield a hidden folder inside ``out_dir`` to write the new run into. On a clean exit the
    new run replaces the old one (``old_names``: its files in ``out_dir``; None: those the new
    run writes again, as ``fpsim reproduce`` replaces figures); on any exception the hidden
    folder is deleted and the old run kept as it was; an ``OSError`` is raised again saying
    which file failed and what was kept."""
    token = secrets.token_hex(6)
    staging = out_dir / f"{NEW}{token}"
    try:
        staging.mkdir()
        yield staging
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError):
            raise _old_run_kept(err, out_dir, staging, old_names) from err
        raise
    _swap_in(out_dir, token, old_names)


def _swap_in(out_dir: Path, token: str, old_names: list | None) -> None:
    staging, moving, aside = (out_dir / f"{kind}{token}" for kind in (NEW, MOVING_IN, OLD))
    if old_names is None:
        old_names = sorted(e.name for e in staging.iterdir() if (out_dir / e.name).exists())
    try:
        aside.mkdir()
        for name in old_names:
            os.replace(out_dir / name, aside / name)
        os.replace(staging, moving)     # from here on, the new run is the one kept
    except OSError as err:
        _undo(out_dir, staging, aside)
        raise _old_run_kept(err, out_dir, staging, old_names) from err
    _move_in(out_dir, moving, aside)


def _undo(out_dir: Path, staging: Path, aside: Path) -> None:
    """Put the old run's files back from ``aside`` and delete the unfinished new run."""
    if aside.is_dir():
        for entry in aside.iterdir():
            os.replace(entry, out_dir / entry.name)
        aside.rmdir()
    shutil.rmtree(staging, ignore_errors=True)


def _move_in(out_dir: Path, moving: Path, aside: Path) -> None:
    """Move the complete new run's files into ``out_dir``, then delete the old run's."""
    for entry in moving.iterdir():
        os.replace(entry, out_dir / entry.name)
    moving.rmdir()
    shutil.rmtree(aside, ignore_errors=True)


def _old_run_kept(err: OSError, out_dir: Path, staging: Path,
                  old_names: list | None) -> OSError:
    """``err`` as one sentence: which file of the new run failed, and that the old is kept."""
    failed = Path(err.filename) if err.filename is not None else None
    if failed is None:
        where = ""
    elif failed.parent == staging:
        where = f"{failed.name}: "
    else:
        where = f"{failed}: "
    kept = f" ({', '.join(old_names)})" if old_names else ""
    return OSError(err.errno, f"the new run could not be written ({where}{err.strerror or err}); "
                              f"nothing was replaced: {out_dir} keeps its previous run{kept} "
                              f"and the unfinished new run was removed")


def tidy_run_folder(out_dir: Path) -> list[str]:
    """Settle what a killed run left in ``out_dir`` (module doc); returns notes saying what
    was done. Call it holding the folder's lock."""
    found: dict[str, set] = {}
    for entry in out_dir.iterdir():
        match = _OURS.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.setdefault(match.group(2), set()).add(match.group(1))
    notes = [_settle(out_dir, token, kinds) for token, kinds in sorted(found.items())]
    removed = remove_stale_temporaries(out_dir)
    if removed:
        notes.append(f"removed {len(removed)} temporary file(s) in {out_dir} left by a write "
                     f"that was killed ({', '.join(removed)})")
    return notes


def _settle(out_dir: Path, token: str, kinds: set) -> str:
    staging, moving, aside = (out_dir / f"{kind}{token}" for kind in (NEW, MOVING_IN, OLD))
    if "in" in kinds:
        _move_in(out_dir, moving, aside)
        return (f"completed the replacement of the run in {out_dir} that was stopped while "
                f"its new files moved in ({moving.name})")
    if "old" in kinds and "new" in kinds:
        _undo(out_dir, staging, aside)
        return (f"undid the replacement of the run in {out_dir} that was stopped while its old "
                f"files moved aside: the old run is restored, the unfinished new one deleted")
    leftover = aside if "old" in kinds else staging
    shutil.rmtree(leftover)
    what = ("the files of a replaced run" if "old" in kinds
            else "an unfinished run that was to replace the one there (it was stopped)")
    return f"deleted {leftover}, {what}"
