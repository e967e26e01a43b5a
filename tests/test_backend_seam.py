"""The backend seam, read from the source: above ``fpsim.backend`` nothing imports an array
library, every ``xp.NAME`` is in the closed ``NAMESPACE``, no array attribute outside the
closed ``ARRAY_ATTRIBUTES`` is read, no NumPy scalar type is called as a constructor, and
rounding and Philox kernels are reached through the backend, not ``fpsim.rounding``.

The attribute check is static, so it sees only names that cannot be something else: an
ndarray attribute that an engine class (``Tensor.sum``, ``Tensor.size``) or a builtin type
(``dict.copy``) also has is refused only on ``<tensor>.data``. The ``numpy-strict`` backend
checks every array at run time (``test_engine_tests_pass_on_numpy_strict``).

The exceptions are named: modules that read and write files or talk to frameworks on the host
(the CLI, experiments, plots, conformance adapters, checkpoint / trace / dataset files).
"""
from __future__ import annotations

import ast

import numpy as np
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


def _engine_class_attributes() -> set:
    names = set()
    for _, _, tree in ENGINE:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)      # dataclass fields (UnderflowCount)
    return names


def _builtin_attributes() -> set:
    return {name for kind in (dict, list, set, frozenset, tuple, str, bytes, int, float, complex)
            for name in dir(kind) if not name.startswith("_")}


NDARRAY_ATTRIBUTES = {name for name in dir(np.ndarray) if not name.startswith("_")}
# ndarray names that engine classes or builtins also have: refused on ``.data`` only
AMBIGUOUS = (NDARRAY_ATTRIBUTES & (_engine_class_attributes() | _builtin_attributes())
             - backend.ARRAY_ATTRIBUTES)
# plus the dtype attributes that only NumPy has
REFUSED = (NDARRAY_ATTRIBUTES - backend.ARRAY_ATTRIBUTES - AMBIGUOUS) | {"kind", "char", "num"}
SCALAR_TYPES = {name for name in backend.NAMESPACE if isinstance(getattr(np, name), type)
                and issubclass(getattr(np, name), np.generic)}


def array_attribute_uses(tree) -> list:
    """(line, what) for each array attribute or scalar constructor the seam refuses."""
    modules = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in modules | {"xp", "backend"}:
                continue
            on_data = isinstance(owner, ast.Attribute) and owner.attr == "data"
            if node.attr in REFUSED or node.attr in AMBIGUOUS and on_data:
                found.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "xp"
              and node.func.attr in SCALAR_TYPES):
            found.append((node.lineno, f"xp.{node.func.attr}(...)"))
    return sorted(found)


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
def test_no_array_attributes_outside_the_closed_list(name, path, tree):
    used = array_attribute_uses(tree)
    assert not used, (f"{path}: array attributes outside fpsim.backend.ARRAY_ATTRIBUTES "
                      f"({', '.join(sorted(backend.ARRAY_ATTRIBUTES))}) or NumPy scalar "
                      f"constructors; use fpsim.backend's functions: {used}")


def test_the_attribute_check_can_fail():
    source = """
from ..backend import xp
import math
def f(x, t, d):
    y = x.astype(xp.float64).view(xp.uint64)
    if d.dtype.kind == "f" and x.flags.c_contiguous:
        return t.data.reshape(-1), t.data.sum(), x.tolist(), xp.float32(1.5)
    return x.shape, x.T, t.sum(), t.reshape(2), {}.copy(), math.pi, xp.reshape(x, (2,))
"""
    assert [what for _, what in array_attribute_uses(ast.parse(source))] == [
        ".astype", ".view", ".flags", ".kind", ".reshape", ".sum", ".tolist", "xp.float32(...)"]


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
        _ = backend.xp.exp


def test_choose_backend():
    assert backend.available()[0] == "numpy" and "cupy" not in backend.available()
    with backend.use_backend("numpy") as chosen:
        assert chosen.name == "numpy" and backend.name() == "numpy"
    with pytest.raises(ValueError, match=f"unknown backend 'cupy'; accepted: "
                                         f"{backend.accepted()}$"):
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
    assert "FPSIM_BACKEND='tpu' is not a backend of this fpsim; accepted: numpy" in done.stderr


def test_unknown_backend_under_python_m_fpsim_is_one_line():
    import os
    import subprocess
    import sys
    env = {**os.environ, "FPSIM_BACKEND": "cupy"}
    done = subprocess.run([sys.executable, "-m", "fpsim", "--help"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"fpsim: error: FPSIM_BACKEND='cupy' is not a backend of this fpsim; accepted: "
        f"{backend.accepted()} (unset FPSIM_BACKEND for numpy; CuPy is not part of this "
        f"version)"]


def test_an_optional_backend_without_its_library_says_what_to_install(monkeypatch):
    monkeypatch.delitem(backend._IMPLEMENTATIONS, "torch", raising=False)   # as without torch
    with pytest.raises(ValueError, match=r"backend 'torch' needs torch, which is not installed "
                                         r"here: pip install 'fpsim\[torch\]'"):
        backend.set_backend("torch")
    with pytest.raises(ValueError, match=r"FPSIM_BACKEND='Torch': backend 'torch' needs torch"):
        backend.backend_from_environment("Torch")
    with pytest.raises(ValueError, match=r"backend 'torch:cuda' needs torch, which is not"):
        backend.set_backend("torch:cuda")
    assert backend.name() == "numpy"


@pytest.mark.parametrize("command", [["train", "--steps", "2"], ["reproduce", "--quick"],
                                     ["sweep", "spec.toml"]])
@pytest.mark.parametrize("chosen", ["cupy", "torch:tpu"])
def test_a_backend_that_is_not_there_is_one_line_and_nothing_is_written(command, chosen,
                                                                       tmp_path, capsys):
    from fpsim.cli import main
    (tmp_path / "spec.toml").write_text("[base]\nsteps = 2\n[grid]\nseed = [0, 1]\n")
    command = [tmp_path / c if c.endswith(".toml") else c for c in command]
    out = tmp_path / "out"
    assert main([*map(str, command), "--out", str(out), "--backend", chosen]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fpsim: error: unknown backend {chosen!r}; accepted: {backend.accepted()}"]
    assert not out.exists() and backend.name() == "numpy"


@pytest.mark.parametrize("value,chosen", [(None, "numpy"), ("", "numpy"), ("  ", "numpy"),
                                          ("NUMPY", "numpy"), (" numpy\n", "numpy"),
                                          ("Numpy-Strict", "numpy-strict")])
def test_backend_from_the_environment_ignores_case_and_spaces(value, chosen):
    assert backend.backend_from_environment(value) == chosen


@pytest.mark.parametrize("value", ["cupy", "num py", "numpy_strict", "\x00"])
def test_backend_from_the_environment_refuses_others(value):
    with pytest.raises(ValueError, match="is not a backend of this fpsim; accepted: numpy, "
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
    """A 16-mixed MLP's parameters and loss after a few SGD steps, as host bytes."""
    from fpsim import nn
    from fpsim.autograd import Tensor, cross_entropy, use_policy
    from fpsim.optim import SGD, Optimizer
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    with use_policy("16-mixed"):
        model = nn.MLP([8, 16, 3], rng=1)
        opt = Optimizer(model, SGD(lr=0.1, momentum=0.9))
        for _ in range(steps):
            labels = backend.asarray(y, backend.xp.int64)
            loss = cross_entropy(model(Tensor(backend.asarray(x))), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [backend.host_bytes(p.data) for p in model.parameters()], backend.host_bytes(loss.data)


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
