"""NaN bits on the torch backend: the engine's elementwise ops and their gradients give NumPy's
NaNs bit for bit (sign and payload) on inputs that make NaNs: NaNs of both signs with
payloads, infinities, values that overflow the policy's formats (docs/backends.md).

Which of two NaNs an operation returns when both operands are NaN is left open by IEEE 754;
NumPy's own choice varies with its SIMD path and the array's length, torch's add returns its
second operand's. So the engine never lets a NaN's bits depend on that choice where one NaN
comes in: a NaN input of an activation comes out as itself, forward and backward, a NaN
upstream gradient as itself (``fpsim.exact.nan_as_input``), and those are compared bit for
bit here. Where two NaN operands meet in one add or multiply (``test_two_nans``), only the
NaN's position is promised. The CPU only: CUDA's arithmetic NaN is canonical."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch backend needs PyTorch (fpsim[torch])")

from fpsim import autograd as ag, backend, use_policy  # noqa: E402
from fpsim.autograd import Tensor  # noqa: E402

POLICIES = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
NANS = np.array([0x7FC00000, 0xFFC00000, 0x7FC12345, 0xFFD00001, 0x7F800001, 0xFF800003],
                np.uint32).view(np.float32)          # quiet and signalling, both signs
FINITE = np.float32([0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 30.0, -30.0, 200.0, -200.0, 1e-40,
                     65504.0, 70000.0, -1e5, 3.4e38, -3.4e38])   # the last four overflow fp16
INFS = np.float32([np.inf, -np.inf])

UNARY = {"neg": ag.neg, "relu": ag.relu, "sqrt": ag.sqrt, "exp": ag.exp, "log": ag.log,
         "tanh": ag.tanh, "sigmoid": ag.sigmoid, "silu": ag.silu, "gelu": ag.gelu,
         "gelu_tanh": lambda t: ag.gelu(t, approximate="tanh")}
BINARY = {"add": ag.add, "sub": ag.sub, "mul": ag.mul, "div": ag.div}


def _spread(values, n, shift):
    """``values`` repeated over ``n`` places from ``shift`` on: every value lands both in
    SIMD blocks and in the scalar tails of both libraries' loops."""
    return np.roll(np.resize(values, n), shift)


def _bits(array):
    array = backend.to_numpy(array)
    return array.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[array.dtype.itemsize])


def _run(backend_name, op, args, g, policy):
    """(output bits, each argument's gradient bits) of ``op`` on the backend."""
    with backend.use_backend(backend_name), use_policy(policy):
        tensors = [Tensor(a.copy(), requires_grad=True) for a in args]
        out = op(*tensors)
        out.backward(Tensor(g.copy()))
        return [_bits(out.data)] + [_bits(t.grad.data) for t in tensors]


def _as_floats(bits):
    return bits.view({2: np.float16, 4: np.float32, 8: np.float64}[bits.dtype.itemsize])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_give_numpys_nan_bits(name, policy):
    x = _spread(np.concatenate([FINITE, INFS, NANS]), 67, 5)
    g = _spread(np.concatenate([np.float32([1.5, -0.25, 3.0]), INFS, NANS[::-1]]), 67, 0)
    expected = _run("numpy", UNARY[name], [x], g, policy)
    got = _run("torch", UNARY[name], [x], g, policy)
    assert np.isnan(_as_floats(expected[1])).any()         # the inputs do make NaNs
    for what, want, have in zip(("output", "gradient"), expected, got):
        differ = np.flatnonzero(want != have)
        assert differ.size == 0, (what, x[differ[:4]], g[differ[:4]], want[differ[:4]],
                                  have[differ[:4]])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_with_one_nan_give_numpys_nan_bits(name, policy):
    values = np.concatenate([FINITE, INFS])
    x = _spread(np.concatenate([values, NANS]), 53, 0)
    y = _spread(np.concatenate([values[::-1], NANS[::-1]]), 53, 11)
    y[np.isnan(x)] = np.float32(1.25)                   # one NaN per operation
    g = _spread(np.float32([1.0, -3.0, 0.5, np.inf]), 53, 2)
    expected = _run("numpy", BINARY[name], [x, y], g, policy)
    got = _run("torch", BINARY[name], [x, y], g, policy)
    assert np.isnan(_as_floats(expected[0])).sum() >= 2 * NANS.size
    for what, want, have in zip(("output", "x's gradient", "y's gradient"), expected, got):
        assert np.array_equal(want, have), what


def test_two_nans():
    """Where both operands are NaN only the position is promised (module doc)."""
    x = np.resize(NANS, 40)
    y = np.resize(NANS[::-1], 40)
    for name in ("add", "mul"):
        want, have = (_run(b, BINARY[name], [x, y], np.ones(40, np.float32), "32-true")[0]
                      for b in ("numpy", "torch"))
        assert np.isnan(_as_floats(want)).all() and np.isnan(_as_floats(have)).all()


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh"])
def test_a_nan_through_an_activation_comes_out_as_itself(name):
    """The rule that fixes the bits: forward and backward, x's own NaN (quieted), wherever it
    sits in the array; a NaN upstream gradient comes back as itself."""
    x = _spread(np.concatenate([FINITE, NANS]), 45, 3)
    g = np.ones_like(x)
    g[::7], g[3::7] = NANS[1], NANS[2]           # on NaN and on finite x
    out, grad = _run("numpy", UNARY[name], [x], g, "32-true")
    quiet = x.view(np.uint32) | np.uint32(0x00400000)
    nan = np.isnan(x)
    assert np.array_equal(out[nan], quiet[nan])
    from_g = np.isnan(g)
    assert np.array_equal(grad[from_g], g.view(np.uint32)[from_g])
    assert np.array_equal(grad[nan & ~from_g], quiet[nan & ~from_g])
