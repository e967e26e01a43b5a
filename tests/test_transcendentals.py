"""The engine's transcendental ops against MPFR: evaluated in float64 and rounded once, their
float32 results are the correctly rounded values of the exact functions (MPFR at 200 bits,
rounded once to binary32 with subnormals), at every point tested, the far tails included."""
from __future__ import annotations

import numpy as np
import pytest

gmpy2 = pytest.importorskip("gmpy2")

from fpsim.autograd import Tensor, use_policy  # noqa: E402

_WIDE = gmpy2.context(precision=200)
_BINARY32 = gmpy2.ieee(32)


def _sigmoid(x):
    return 1 / (1 + gmpy2.exp(-x))


def _gelu(x):
    return x * gmpy2.erfc(-x / gmpy2.sqrt(2)) / 2


EXACT = {"exp": gmpy2.exp, "log": gmpy2.log, "tanh": gmpy2.tanh, "sigmoid": _sigmoid,
         "gelu": _gelu}


def _points(name: str) -> np.ndarray:
    rng = np.random.default_rng(sorted(EXACT).index(name))
    if name == "log":
        x = np.exp2(rng.uniform(-149, 128, 3000)) * rng.uniform(1, 2, 3000)
        x = np.concatenate([x, 1 + rng.uniform(-2 ** -10, 2 ** -10, 500)])
    elif name == "exp":
        x = rng.uniform(-104, 89, 3000)
    elif name == "gelu":   # the negative tail down to where x * Phi(x) leaves float32
        x = np.concatenate([rng.uniform(-14, 6, 2500), rng.uniform(-14, -5.4, 1000)])
    else:
        x = np.concatenate([rng.uniform(-20, 20, 2500), rng.uniform(-1, 1, 500) * 2.0 ** -20])
    with np.errstate(over="ignore"):
        return x.astype(np.float32)


def _correctly_rounded(fn, x: np.ndarray) -> np.ndarray:
    out = []
    for value in x.tolist():
        with _WIDE:
            exact = fn(gmpy2.mpfr(value))
        with _BINARY32:
            out.append(float(gmpy2.mpfr(exact)))
    return np.array(out, np.float32)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_fp32_results_are_correctly_rounded(name):
    x = _points(name)
    with use_policy("32-true"):
        got = getattr(Tensor(x), name)().data
    want = _correctly_rounded(EXACT[name], x)
    wrong = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert wrong.size == 0, (f"{name}: {wrong.size} of {x.size} differ, e.g. x={x[wrong[:3]]}: "
                             f"got {got[wrong[:3]]}, want {want[wrong[:3]]}")


def test_gelu_keeps_the_negative_tail():
    """The textbook x * (1 + erf(x / sqrt 2)) / 2 is 0 in float64 below x = -8.3; x * Phi(x)
    is a normal float32 down to x = -13 (and PyTorch's float32 kernel gives 0 below -5.5)."""
    with use_policy("32-true"):
        y = Tensor(np.float32([-6.0, -9.0, -13.0])).gelu().data
    assert (y < 0).all()
    assert y[1] == np.float32(_correctly_rounded(_gelu, np.float32([-9.0]))[0])
