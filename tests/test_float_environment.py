"""fpsim refuses to round in a floating-point environment other than IEEE's default (rounding
mode, flush-to-zero, denormals-are-zero: process state that would change its bits silently),
and says which setting is wrong."""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
from contextlib import contextmanager

import numpy as np
import pytest

from fpsim import round_to
from fpsim.rounding.environment import environment_problems

LIBM = ctypes.util.find_library("m")
X86_LINUX = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
FE_MODES = {"upward": 0x800, "downward": 0x400, "toward_zero": 0xC00}   # glibc on x86


@contextmanager
def environment(mode=None, mxcsr_bits=0):
    """This thread's rounding mode set through libm, or MXCSR bits set in glibc's fenv_t
    (x86-64: ``__mxcsr`` at byte 28), restored afterwards."""
    libm = ctypes.CDLL(LIBM)
    saved = ctypes.create_string_buffer(32)
    libm.fegetenv(saved)
    try:
        if mode is not None:
            assert libm.fesetround(FE_MODES[mode]) == 0
        if mxcsr_bits:
            env = ctypes.create_string_buffer(saved.raw, 32)
            mxcsr = int.from_bytes(env.raw[28:32], "little") | mxcsr_bits
            ctypes.memmove(ctypes.addressof(env) + 28, mxcsr.to_bytes(4, "little"), 4)
            assert libm.fesetenv(env) == 0
        yield
    finally:
        libm.fesetenv(saved)


pytestmark = pytest.mark.skipif(not (X86_LINUX and LIBM),
                                reason="sets x86's MXCSR through glibc's fenv (x86-64 Linux)")


def test_the_default_environment_passes():
    assert environment_problems() == []
    assert round_to(np.float32([1.1]), "fp16")[0] == np.float32(1.099609375)


@pytest.mark.parametrize("mode", sorted(FE_MODES))
def test_another_rounding_mode_is_refused(mode):
    with environment(mode=mode):
        problems = environment_problems()
        with pytest.raises(FloatingPointError, match="not round-to-nearest"):
            round_to(np.float32([1.1]), "fp16")
    assert problems == ["the rounding mode is not round-to-nearest"]
    assert environment_problems() == []


@pytest.mark.parametrize("bits,words", [(0x8000, "flushed to zero"), (0x0040, "read as zero")])
def test_flush_to_zero_and_denormals_are_zero_are_refused(bits, words):
    with environment(mxcsr_bits=bits):
        with pytest.raises(FloatingPointError, match=words):
            round_to(1.5, "bf16")
    assert environment_problems() == []
