"""The ``fpsim`` console script, outside the ``fpsim`` package on purpose.

``import fpsim`` runs code before any command does: the package chooses its array backend
(``FPSIM_BACKEND``) and loads NumPy and matplotlib, which takes a moment. Errors there happen
before ``fpsim.cli.main`` can catch anything, so this module, which imports nothing of fpsim
at its top, does the importing inside ``try``: a Ctrl-C while fpsim loads exits 130 with one
line, and a backend the environment names but this fpsim lacks (a ``ValueError`` raised at
import) is reported as ``fpsim: error: ...`` with exit status 2, as every other bad input is.

A Ctrl-C must not interrupt the import itself: inside a compiled module's start-up (NumPy's
``import_array()`` in the extensions that load NumPy) a ``KeyboardInterrupt`` is printed as a
traceback and replaced by an ``ImportError`` telling the user to reinstall NumPy. So the first
Ctrl-C while fpsim loads is only noted, the loading finishes (a moment), and the command does
not run; a second Ctrl-C interrupts at once.
"""
from __future__ import annotations

import signal
import sys
import threading

__all__ = ["main"]


def main() -> int:
    """Import the command line and run it; returns the exit status."""
    pressed: list = []
    restore = _note_ctrl_c(pressed)
    try:
        from fpsim.cli import main as run_command
    except KeyboardInterrupt:
        return _interrupted()
    except ValueError as err:   # raised while fpsim loads: FPSIM_BACKEND names no backend
        if pressed:
            return _interrupted()
        print(f"fpsim: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except BaseException:
        if pressed:             # whatever a Ctrl-C became inside a compiled module
            return _interrupted()
        raise
    finally:
        restore()
    if pressed:
        return _interrupted()
    return run_command()


def _interrupted() -> int:
    print("fpsim: interrupted (Ctrl-C)", file=sys.stderr)
    return 130


def _note_ctrl_c(pressed: list):
    """Until the returned function is called, a first Ctrl-C is appended to ``pressed``
    instead of raising; a second raises ``KeyboardInterrupt``. Left alone where Ctrl-C is not
    Python's to handle (ignored, as in a background job, or handled by someone else)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None

    def note(signum, frame):
        if pressed:
            raise KeyboardInterrupt
        pressed.append(signum)

    signal.signal(signal.SIGINT, note)
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    sys.exit(main())
