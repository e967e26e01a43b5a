"""The engine's own tests rerun under other backends (numpy-strict, torch), in the background.

Each rerun is a second pytest process (``FPSIM_BACKEND=...``). Run inside the test that
checks it, it would leave one of the two cores idle for a minute or more while the main
session waits. So ``tests/conftest.py`` starts the reruns the session will check as soon as
collection shows them, one after another, in a background thread; each test then waits for
its own result (``result``), which is the same pass/fail it would have computed itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1800

#: The engine's tests: what runs again under numpy-strict and torch.
ENGINE_TESTS = [f"tests/{name}" for name in (
    "test_autograd_engine.py", "test_autograd_gradcheck.py", "test_nn.py", "test_policy.py",
    "test_scaling.py", "test_scaling_presets.py", "test_optim.py", "test_optim_fast.py",
    "test_train.py", "test_accumulation.py", "test_accumulation_fp8.py", "test_scatter.py",
    "test_softmax_exact.py",
    "test_exact_norm.py", "test_split_certificate.py", "test_sums_certificate.py",
    "test_fast_matmul_paths.py",
    "test_underflow_count.py", "test_optim_transforms.py", "test_resume_checked.py",
    "test_checkpoint.py", "test_graph_fastpaths.py", "test_autograd_properties.py",
    "test_optim_torch.py", "test_stochastic_rounding.py", "test_arith_fp32_cast.py",
    "test_cr_hard_cases.py", "test_strict_backend.py", "test_conv.py", "test_pool_norm.py",
    "test_layer_norm_silu.py", "test_select_gelu_tanh.py", "test_batchnorm_dropout.py",
    "test_attention.py", "test_from_torch.py", "test_train_anything.py", "test_per_layer.py",
    "test_quant_blocks.py", "test_fp8_training.py", "test_batched_matmul.py",
    "test_cr_vectorised.py", "test_fp4_training.py", "test_optim_extend.py",
    "test_nn_common_layers.py", "test_nn_stateful_layers.py")]

#: the default selection without the ini's nbval options: the reruns collect no notebooks, and
#: a machine without nbval (the GPU image, .ci/device-check) must run them too
RERUN_OPTIONS = ["-o", "addopts=", "--strict-markers", "-m", "not slow and not gpu"]

#: test node name -> the backend its rerun uses
RERUN_TESTS = {"test_engine_tests_pass_on_numpy_strict": "numpy-strict",
               "test_engine_tests_pass_on_torch[cpu]": "torch"}

_lock = threading.Lock()
_runs: dict[str, dict] = {}       # backend -> {"done": Event, "process", "returncode", "output"}
_stopped = threading.Event()


def start(backends) -> None:
    """Rerun the engine's tests under each of ``backends`` (in order, one at a time) in a
    background thread; a backend already started is not started again."""
    with _lock:
        todo = [name for name in backends if name not in _runs]
        for name in todo:
            _runs[name] = {"done": threading.Event(), "process": None}
    if todo:
        threading.Thread(target=_run_in_order, args=(todo,), daemon=True).start()


def _run_in_order(backends) -> None:
    for name in backends:
        run = _runs[name]
        try:
            env = {**os.environ, "FPSIM_BACKEND": name}
            with _lock:
                if _stopped.is_set():
                    run.update(returncode=-1, output="the session ended first")
                    continue
                run["process"] = subprocess.Popen(
                    [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                     *RERUN_OPTIONS, *ENGINE_TESTS], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
            out, err = run["process"].communicate(timeout=TIMEOUT_S)
            run.update(returncode=run["process"].returncode,
                       output=out[-4000:] + err[-2000:])
        except subprocess.TimeoutExpired:
            run["process"].kill()
            run.update(returncode=-1, output=f"the rerun under {name} took over {TIMEOUT_S} s")
        except OSError as err:
            run.update(returncode=-1, output=f"the rerun under {name} could not start: {err}")
        finally:
            run["done"].set()


def result(backend: str) -> tuple[int, str]:
    """(exit status, the end of its output) of the rerun under ``backend``; starts it if no
    one has, and waits for it."""
    start([backend])
    run = _runs[backend]
    if not run["done"].wait(TIMEOUT_S * (len(_runs) + 1)):
        return -1, f"no result from the rerun under {backend}"
    return run["returncode"], run["output"]


def stop() -> None:
    """End reruns still going (the session ended without waiting for them)."""
    with _lock:
        _stopped.set()
        for run in _runs.values():
            process = run.get("process")
            if process is not None and process.poll() is None:
                process.kill()
