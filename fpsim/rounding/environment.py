"""The floating-point environment fpsim's bits assume: IEEE 754's default, round to nearest
even with subnormals (no flush-to-zero, no denormals-are-zero), in every thread that rounds.

Why check: the rounding kernels and the float64 evaluations run on the CPU's own float
arithmetic, whose rounding mode and subnormal flags are process state (x86's MXCSR). A
library built with ``-ffast-math`` can set flush-to-zero when it is loaded, and ``fesetround``
changes the mode; either would change fpsim's results silently. ``check_environment`` runs
four float operations whose results tell those settings apart (~0.3 us), and raises with the
reason instead.
"""
from __future__ import annotations

import struct

__all__ = ["check_environment", "environment_problems"]

# Runtime values (a list, so the compiler cannot fold the probes at import):
# 1, 0.75 and 0.25 units of 1's last place (2**-52), the smallest normal float64, 1/2.
_PROBE = [1.0, 0.75 * 2.0 ** -52, 0.25 * 2.0 ** -52, 2.0 ** -1022, 0.5]


def environment_problems() -> list[str]:
    """What in this thread's floating-point environment differs from IEEE's default."""
    one, three_quarters, quarter, smallest_normal, half = _PROBE
    problems = []
    if (one + three_quarters, one + quarter, -one - three_quarters) != \
            (1.0 + 2.0 ** -52, 1.0, -1.0 - 2.0 ** -52):
        problems.append("the rounding mode is not round-to-nearest")
    subnormal = smallest_normal * half                   # 2**-1023: a subnormal result
    # its bits read from memory, not through the float unit (DAZ would read it as zero)
    if struct.pack("<d", subnormal) == bytes(8):
        problems.append("subnormal results are flushed to zero (FTZ)")
    elif subnormal * 2.0 != smallest_normal:
        problems.append("subnormal inputs are read as zero (DAZ)")
    return problems


def check_environment() -> None:
    """Raise ``FloatingPointError`` naming what differs from the IEEE default environment."""
    problems = environment_problems()
    if problems:
        raise FloatingPointError(
            "fpsim needs IEEE 754's default floating-point environment, and here "
            + " and ".join(problems) + " (a library built with -ffast-math, or fesetround, "
            "changed it); its results would not be fpsim's bits")
