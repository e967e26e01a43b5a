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
# Host-side adapters above the seam (files, figures, framework oracles), as the backend
# names them: engine data reaches them only as host arrays (``backend.to_numpy``).
HOST_ADAPTERS = backend.HOST_PACKAGES
HOST_MODULES = backend.HOST_MODULES
# What ``fpsim.rounding`` offers that is not an array kernel: constants and host scalars.
ROUNDING_CONSTANTS = {"MODES", "float64_round_to_odd"}

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
    assert backend.available()[0] == "numpy" and "cupy" not in backend.available()
    with backend.use_backend("numpy") as chosen:
        assert chosen.name == "numpy" and backend.name() == "numpy"
    with pytest.raises(ValueError, match="unknown backend 'cupy'; available: numpy, numpy-strict"):
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
    assert "FPSIM_BACKEND='tpu' is not a backend of this fpsim; available: numpy" in done.stderr


@pytest.mark.parametrize("value,chosen", [(None, "numpy"), ("", "numpy"), ("  ", "numpy"),
                                          ("NUMPY", "numpy"), (" numpy\n", "numpy"),
                                          ("Numpy-Strict", "numpy-strict")])
def test_backend_from_the_environment_ignores_case_and_spaces(value, chosen):
    assert backend.backend_from_environment(value) == chosen


@pytest.mark.parametrize("value", ["cupy", "num py", "numpy_strict", "\x00"])
def test_backend_from_the_environment_refuses_others(value):
    with pytest.raises(ValueError, match="is not a backend of this fpsim; available: numpy, "
                                         "numpy-strict"):
        backend.backend_from_environment(value)


class _CountingNamespace:
    """NumPy's functions behind a counter: a second backend that is NumPy underneath, so a
    run on it must give NumPy's bits, and the counts show the engine really called it."""

    def __init__(self):
        import numpy as np
        self.calls = 0
        for attr in backend.NAMESPACE:
            value = getattr(np, attr)
            if callable(value) and not isinstance(value, type):
                value = self._counted(value)
            setattr(self, attr, value)

    def _counted(self, fn):
        def call(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)
        return call


def _train_bits(steps=3):
    import numpy as np
    from fpsim import nn
    from fpsim.autograd import Tensor, cross_entropy, use_policy
    from fpsim.optim import SGD, Optimizer
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    with use_policy("16-mixed"):
        model = nn.MLP([8, 16, 3], rng=1)
        opt = Optimizer(model, SGD(lr=0.1))
        for _ in range(steps):
            loss = cross_entropy(model(Tensor(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.data.tobytes() for p in model.parameters()], loss.data.tobytes()


def test_engine_runs_on_a_registered_backend_with_the_same_bits():
    from fpsim.backend.numpy_backend import NumpyBackend
    namespace = _CountingNamespace()

    class Counting(NumpyBackend):
        name = "counting-numpy"
        xp = namespace

    backend.register_backend("counting-numpy", Counting)
    reference = _train_bits()
    with backend.use_backend("counting-numpy"):
        assert backend.name() == "counting-numpy"
        counted = _train_bits()
    assert backend.name() == "numpy"
    assert namespace.calls > 100
    assert counted == reference
    with pytest.raises(ValueError, match="already registered"):
        backend.register_backend("counting-numpy", Counting)


def test_a_backend_missing_namespace_names_is_refused():
    from fpsim.backend.numpy_backend import NumpyBackend

    class Partial(NumpyBackend):
        name = "partial"
        xp = type("PartialNamespace", (), {"add": staticmethod(lambda a, b: a + b)})

    backend.register_backend("partial", Partial)
    with pytest.raises(ValueError, match="lacks namespace names: .*where"):
        backend.set_backend("partial")
    assert backend.name() == "numpy"
