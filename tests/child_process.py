"""Children that a test interrupts with a real Ctrl-C (SIGINT)."""
import signal


def ctrl_c_reaches_python() -> None:
    """``preexec_fn`` for such a child: SIGINT back to its default action. A test suite run
    as a background job (``cmd &`` in a shell without job control) inherits SIGINT ignored,
    and Python installs its KeyboardInterrupt handler only where SIGINT is not ignored: the
    child would then never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
