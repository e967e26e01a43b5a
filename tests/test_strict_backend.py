"""The ``numpy-strict`` backend: each rule refuses what it says, only in engine code, and the
engine computes NumPy's bits on it; the engine's own tests pass on it
(``test_engine_tests_pass_on_numpy_strict``, what CI runs)."""
from __future__ import annotations

import numpy as np
import pytest

import engine_reruns
from fpsim import backend
from fpsim.backend.strict import StrictArray, StrictError


def _in_engine(source: str, **values):
    """Run ``source`` as if it were a line of fpsim.exact (an engine module); returns
    ``result``."""
    scope = {"__name__": "fpsim.exact.probe", "xp": backend.xp, "backend": backend, **values}
    exec(compile(source, "fpsim/exact/probe.py", "exec"), scope)
    return scope.get("result")


@pytest.fixture
def strict():
    with backend.use_backend("numpy-strict"):
        yield backend


@pytest.mark.parametrize("source,rule", [
    ("result = x.astype(xp.float64)", "attribute .astype"),
    ("result = x.size", "attribute .size"),
    ("result = x.sum()", "attribute .sum"),
    ("result = x.view(xp.uint32)", "attribute .view"),
    ("result = x + backend.scalar(1.0, xp.float64)", "0-d float64 with an n-d float32"),
    ("result = xp.add(x, backend.scalar(1.0, xp.float64))", "0-d float64 with an n-d float32"),
    ("result = x * i", "mixes integer int64 and float float32"),
    ("result = i * 0.5", "integer int64 array with a Python float"),
    ("result = i & u", "signed and unsigned"),
    ("result = b + b", "bool arrays"),
    ("result = -b", "negative of a bool array"),
    ("result = u - u", "subtract on uint32 arrays"),
    ("result = u >> 1", "right_shift on uint32 arrays"),
    ("result = u < 3", "less on uint32 arrays"),
    ("result = xp.sum(u)", "sum on uint32 arrays"),
    ("result = -u", "negative of a uint32 array"),
    ("x[0] = backend.asarray([2.0], xp.float64)[0]", "assigns float64 values into a float32"),
    ("import numpy\nresult = numpy.asarray(x)", "implicitly"),
    ("result = xp.where(x, x, x)", "condition is not a bool array"),
    ("result = x / 3.0", "divides with a Python or NumPy scalar"),
    ("result = 3.0 / x", "divides with a Python or NumPy scalar"),
    ("x /= 3", "divides with a Python or NumPy scalar"),
])
def test_each_rule_refuses_in_engine_code(strict, source, rule):
    values = {"x": backend.asarray([1.0, 2.0]), "i": backend.asarray([1, 2], backend.xp.int64),
              "u": backend.asarray([1, 2], backend.xp.uint32),
              "b": backend.asarray([True, False], backend.xp.bool_)}
    with pytest.raises(StrictError, match=rule) as caught:
        _in_engine(source, **values)
    assert str(caught.value).startswith("fpsim.exact.probe:")    # says where


def test_what_every_library_allows_passes(strict):
    x = backend.asarray([1.0, 2.0])
    u = backend.bits(x)
    result = _in_engine("result = (xp.reshape(x, (2, 1)).T * 2.0 + x[0], x.shape, x.ndim, "
                        "x.dtype, backend.size(x), float(xp.sum(x)), backend.astype(x, "
                        "xp.float64) + backend.asarray([1.0], xp.float64), (u & 0x7FFFFFFF) "
                        "== u, ~u | u ^ u, xp.divide(x, 3.0), x / backend.scalar(3.0, "
                        "xp.float32), xp.divide(3.0, x), x / x)", x=x, u=u)
    assert isinstance(result[0], StrictArray) and result[1:6] == ((2,), 1, np.float32, 2, 3.0)


def test_outside_the_engine_a_strict_array_is_a_numpy_array(strict):
    x = backend.asarray([1.0, 2.0])
    assert np.asarray(x).dtype == np.float32 and x.sum() == 3.0 and x.size == 2
    assert float((x + np.float64(1.0))[0]) == 2.0       # tests may mix freely
    np.testing.assert_array_equal(x, [1.0, 2.0])


def test_same_bits_as_numpy(strict):
    from test_backend_seam import _train_bits
    with backend.use_backend("numpy"):
        reference = _train_bits()
    assert _train_bits() == reference


@pytest.mark.numpy_only      # the run under numpy-strict does not start itself again
def test_engine_tests_pass_on_numpy_strict():
    """The engine's tests (autograd, exact, nn, optim, scaling, train) under
    FPSIM_BACKEND=numpy-strict, in CI with the rest (about a minute on 2 cores); the slower
    oracle sweeps (transcendentals, torch scaler traces) run on NumPy only."""
    returncode, output = engine_reruns.result("numpy-strict")   # started at collection
    assert returncode == 0, output


