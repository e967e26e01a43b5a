"""The backend seam, read from the source: above ``fpsim.backend`` nothing imports an array
library, every ``xp.NAME`` is in the closed ``NAMESPACE``, and rounding and Philox kernels
are reached through the backend, not ``fpsim.rounding``.

The exceptions are named: modules that read and write files or talk to frameworks on the host
(the CLI, experiments, plots, conformance adapters, checkpoint / trace / dataset files).
"""
from __future__ import annotations

import ast

import pytest

from fpsim import backend
from test_layers import PACKAGE, RANK, read_modules

ARRAY_LIBRARIES = {"numpy", "cupy", "torch", "jax", "ml_dtypes", "array_api_compat"}
BACKEND_RANK = RANK["backend"]
# Host-side adapters above the seam: files, figures, framework oracles. Engine data reaches
# them only as host arrays (``backend.to_numpy``).
HOST_ADAPTERS = {"experiments", "plots", "conformance", "cli", "__main__", "sweep"}
HOST_MODULES = {"fpsim.train.checkpoint", "fpsim.train.trace", "fpsim.train.data",
                "fpsim.train.cli"}
# What ``fpsim.rounding`` offers that is not an array kernel.
ROUNDING_CONSTANTS = {"MODES"}

MODULES = read_modules(PACKAGE)


def _engine_modules():
    for name, (path, tree) in MODULES.items():
        parts = name.split(".")
        top = parts[1] if len(parts) > 1 else None
        if top is None or RANK.get(top, -1) <= BACKEND_RANK:
            continue
        if top in HOST_ADAPTERS or name in HOST_MODULES:
            continue
        yield name, path, tree


ENGINE = sorted(_engine_modules())


def test_engine_modules_found():
    names = {name for name, _, _ in ENGINE}
    assert {"fpsim.exact.accumulation", "fpsim.autograd.tensor", "fpsim.optim.optimizer",
            "fpsim.scaling.dynamic", "fpsim.nn.layers", "fpsim.train.loop"} <= names


@pytest.mark.parametrize("name,path,tree", ENGINE, ids=[n for n, _, _ in ENGINE])
def test_no_array_library_above_the_seam(name, path, tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.split(".")[0] in ARRAY_LIBRARIES]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in ARRAY_LIBRARIES:
                found.append((node.lineno, node.module))
    assert not found, f"{path}: imports an array library directly: {found}"


@pytest.mark.parametrize("name,path,tree", ENGINE, ids=[n for n, _, _ in ENGINE])
def test_xp_names_are_in_the_closed_namespace(name, path, tree):
    used = {(node.lineno, node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "xp"}
    outside = sorted((line, attr) for line, attr in used if attr not in backend.NAMESPACE)
    assert not outside, f"{path}: xp names outside fpsim.backend.NAMESPACE: {outside}"


@pytest.mark.parametrize("name,path,tree", ENGINE, ids=[n for n, _, _ in ENGINE])
def test_rounding_kernels_through_the_backend(name, path, tree):
    from test_layers import imports
    direct = [(line, imported) for line, module, imported in imports(name, tree, MODULES)
              if module.startswith("fpsim.rounding")
              and (imported is None or imported not in ROUNDING_CONSTANTS)]
    assert not direct, f"{path}: calls fpsim.rounding directly (use fpsim.backend): {direct}"


def test_namespace_is_complete_on_numpy():
    import numpy as np
    assert [attr for attr in sorted(backend.NAMESPACE) if not hasattr(np, attr)] == []


def test_outside_the_namespace_is_a_clear_error():
    with pytest.raises(AttributeError, match="not in fpsim's kernel namespace"):
        backend.xp.exp


def test_choose_backend():
    assert backend.available() == ("numpy",)
    with backend.use_backend("numpy") as chosen:
        assert chosen.name == "numpy" and backend.name() == "numpy"
    with pytest.raises(ValueError, match="unknown backend 'cupy'; available: numpy"):
        backend.set_backend("cupy")
    assert backend.name() == "numpy"


def test_unknown_backend_from_the_environment(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "FPSIM_BACKEND": "tpu"}
    done = subprocess.run([sys.executable, "-c", "import fpsim"], env=env, capture_output=True,
                          text=True)
    assert done.returncode != 0
    assert "unknown backend 'tpu'; available: numpy" in done.stderr
