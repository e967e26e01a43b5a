"""Oracles shared by the tests of the common layers (``test_nn_common_layers.py``,
``test_nn_stateful_layers.py``): running a layer and its PyTorch twin on the same values,
values whose sums are exact, fp32 ulp distances, and the float64 same-function check of
``from_torch``."""
import numpy as np

from fpsim import backend
from fpsim.autograd import Tensor, use_policy

U = 2.0 ** -24


def as_array(t):
    """A tensor's values as a host NumPy array."""
    return backend.to_numpy(t.data)


def sparse_exponents(rng, shape, dtype=np.float32):
    """Values with exponents in [-3, 3] and 8 significant bits: float64 (and fp32) sums of a
    few dozen of them are exact, and they are fp16 numbers."""
    mant = np.round(rng.uniform(1, 2, shape) * 128) / 128
    return (mant * 2.0 ** rng.integers(-3, 4, shape) * rng.choice([-1.0, 1.0], shape)
            ).astype(dtype)


def run_ours(fn, x, gy, policy, fmt=None):
    """fpsim: ``fn`` on ``x`` (in ``fmt``) under ``policy``, backward from ``gy``:
    (output, input gradient, output format name)."""
    with use_policy(policy):
        t = Tensor(x, fmt, requires_grad=True)
        y = fn(t)
        y.backward(Tensor(gy, y.fmt))
    return as_array(y), as_array(t.grad), y.fmt.name


def run_torch(fn, x, gy, dtype):
    """PyTorch: ``fn`` on ``x`` in ``dtype``, backward from ``gy``: (output, input gradient)
    as fp32 arrays."""
    import torch

    t = torch.tensor(x, dtype=dtype, requires_grad=True)
    y = fn(t)
    y.backward(torch.tensor(gy, dtype=dtype))
    return y.detach().float().numpy(), t.grad.float().numpy()


def ulps(ours, theirs):
    """|ours - theirs| in units of the fp32 spacing at the larger magnitude (NaNs equal)."""
    both_nan = np.isnan(ours) & np.isnan(theirs)
    big = np.maximum(np.abs(ours), np.abs(theirs))
    with np.errstate(invalid="ignore"):
        diff = np.abs(ours.astype(np.float64) - theirs) / np.spacing(big.astype(np.float32))
    return np.where(both_nan | (ours == theirs), 0.0, diff)


def same_function_float64(theirs, ours_of, x):
    """``from_torch`` of the float64 torch model: outputs and parameter gradients equal
    within float64 rounding (the layers' arithmetic is the same function)."""
    import torch

    theirs = theirs.double()
    with use_policy("64-true"):
        ours = ours_of(theirs)
        out = ours(Tensor(x))
        out.sum().backward()
    t_out = theirs(torch.tensor(x))
    t_out.sum().backward()
    np.testing.assert_allclose(as_array(out), t_out.detach().numpy(), rtol=1e-12, atol=1e-14)
    mine = dict(ours.named_parameters())
    assert list(mine) == [name for name, _ in theirs.named_parameters()]
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(as_array(mine[name].grad), p.grad.numpy(), rtol=1e-11,
                                   atol=1e-13, err_msg=name)
    return ours
