"""The backward pass counts gradient values that underflow in their format."""
import numpy as np

from fpsim import backend
from fpsim.autograd import Tensor, matmul, use_policy
from fpsim.exact.underflow import count_gradient_underflow


def test_matmul_backward_underflow_is_counted():
    # d(x @ w)/dx = g @ w.T with g = 2**-14 and w = 2**-12: exact 2**-26 -> 0 in fp16.
    with use_policy("16-true"), count_gradient_underflow() as counts:
        x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        w = Tensor(np.full((3, 1), 2.0 ** -12, np.float32))
        (matmul(x, w) * 2.0 ** -14).sum().backward()
    assert not backend.to_numpy(x.grad.data).any()
    assert counts.flushed >= 6 and counts.fraction > 0


def test_nothing_is_counted_in_fp32_or_outside_the_block():
    with use_policy("32-true"), count_gradient_underflow() as counts:
        x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        w = Tensor(np.full((3, 1), 2.0 ** -12, np.float32))
        (matmul(x, w) * 2.0 ** -14).sum().backward()
    assert counts.flushed == 0 and counts.nonzero > 0
    with use_policy("16-true"):
        x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
        (x * 2.0 ** -30).sum().backward()  # no counter active: nothing breaks
    assert not backend.to_numpy(x.grad.data).any()


def test_forward_roundings_are_not_counted():
    with use_policy("16-true"), count_gradient_underflow() as counts:
        Tensor(np.float32([2.0 ** -30])) * 2.0
    assert counts.values == 0
