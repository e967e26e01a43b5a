"""One progress bar for long loops (training steps, sweep cells): tqdm on stderr, shown by
default only on a terminal and not under CI, so logs and pipes stay clean."""
from __future__ import annotations

import os
import sys

__all__ = ["progress_bar"]


def progress_bar(total: int, initial: int, unit: str, progress: bool | None):
    """A tqdm bar over ``total`` items starting at ``initial``, or None when ``progress`` is
    False (or None off a terminal, or with ``CI`` set in the environment)."""
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, leave=False)
