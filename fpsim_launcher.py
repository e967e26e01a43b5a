"""The ``fpsim`` console script, outside the ``fpsim`` package on purpose.

``import fpsim`` runs code before any command does: the package chooses its array backend
(``FPSIM_BACKEND``) and loads NumPy and matplotlib, which takes a moment. Errors there happen
before ``fpsim.cli.main`` can catch anything, so this module, which imports nothing of fpsim
at its top, does the importing inside ``try``: a Ctrl-C while fpsim loads exits 130 with one
line, and a backend the environment names but this fpsim lacks (a ``ValueError`` raised at
import) is reported as ``fpsim: error: ...`` with exit status 2, as every other bad input is.
"""
from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    """Import the command line and run it; returns the exit status."""
    try:
        from fpsim.cli import main as run_command
    except KeyboardInterrupt:
        print("fpsim: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except ValueError as err:   # raised while fpsim loads: FPSIM_BACKEND names no backend
        print(f"fpsim: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return run_command()


if __name__ == "__main__":
    sys.exit(main())
