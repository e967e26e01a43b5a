"""Running a computation both ways for the fused-kernel parity tests (``test_fused_*.py``):
with the NumPy backend's compiled kernels (``use_compiled(True)``) and with the exact layer's
own code (``use_compiled(False)``), checking that the named kernel was offered and then not."""
from __future__ import annotations

import numpy as np

from fpsim import backend
from fpsim.rounding import use_compiled


def both(kernel: str, function, *args):
    """(``function(*args)`` with the fused kernels, the same with the exact layer's own code);
    ``kernel``: a fused kernel the first run must be offered. Leaves the kernels on."""
    use_compiled(True)
    assert backend.fused(kernel) is not None, f"the fused kernel {kernel} is not offered"
    with np.errstate(all="ignore"):
        fused = function(*args)
    use_compiled(False)
    assert backend.fused(kernel) is None
    with np.errstate(all="ignore"):
        reference = function(*args)
    use_compiled(True)
    return fused, reference
