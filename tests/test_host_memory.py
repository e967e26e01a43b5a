"""The NumPy backend keeps freed heap memory (fpsim.backend.host_memory): repeated NumPy
temporaries after ``import fpsim`` reuse pages instead of faulting fresh ones in."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not (hasattr(os, "confstr") and os.confstr("CS_GNU_LIBC_VERSION")),
    reason="the malloc thresholds are glibc's")

_LOOP = """
import resource, numpy as np
import fpsim
b = np.ones(65536, np.float32)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    -0.01 * b.astype(np.float64) + b.astype(np.float64)
start = faults()
for _ in range(200):
    -0.01 * b.astype(np.float64) + b.astype(np.float64)
print((faults() - start) / 200)
"""


def _faults_per_call(**env) -> float:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "FPSIM_KEEP"))}
    out = subprocess.run([sys.executable, "-c", _LOOP], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def test_numpy_temporaries_do_not_page_fault_after_import():
    # three 512 KiB temporaries per call: 384 pages if each came fresh from the kernel
    assert _faults_per_call() < 8


def test_thresholds_are_set_once_and_can_be_refused(monkeypatch):
    from fpsim.backend import host_memory

    assert host_memory.keep_freed_memory() is False          # done at import already
    monkeypatch.setattr(host_memory, "_done", False)
    monkeypatch.setenv("FPSIM_KEEP_FREED_MEMORY", "0")
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", False)
    monkeypatch.delenv("FPSIM_KEEP_FREED_MEMORY")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")             # the user's own tuning wins
    assert host_memory.keep_freed_memory() is False
