"""hypothesis properties: broadcasting shapes, and every op's output (and every gradient) lies
in its declared format."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fpsim.autograd as ag
from fpsim import backend, round_to
from fpsim.autograd import Policy, Tensor, use_policy
from fpsim.formats import BF16, E4M3FN, E5M2, FP16, FP32

FORMATS = [FP16, BF16, E4M3FN, E5M2, FP32]


def _in_format(array, fmt) -> bool:
    array = backend.to_numpy(array)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = round_to(array, fmt)
    same = rounded.view(np.uint32) == array.view(np.uint32)
    return bool(np.all(same | (np.isnan(rounded) & np.isnan(array))))


@settings(max_examples=60, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       op=st.sampled_from(["add", "sub", "mul", "div"]))
def test_broadcasting_shapes_and_gradient_shapes(shapes, op):
    (sa, sb), expected = shapes.input_shapes, shapes.result_shape
    a = Tensor(np.full(sa, 1.5), requires_grad=True)
    b = Tensor(np.full(sb, 0.75), requires_grad=True)
    out = getattr(ag, op)(a, b)
    assert out.shape == expected
    out.backward(np.ones(expected))
    assert a.grad.shape == sa and b.grad.shape == sb
    # d(sum(a + b))/da counts how many output elements each a element reached
    if op == "add":
        assert backend.to_numpy(a.grad.data).sum() == np.prod(expected)


UNARY = ["neg", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "softmax",
         "log_softmax", "sum", "mean", "max", "square", "transpose", "mul_self", "add_scaled",
         "div", "sub_row", "concatenate"]


def _apply(name, t):
    if name == "square":
        return t ** 2
    if name == "transpose":
        return t.T
    if name == "mul_self":
        return t * t
    if name == "add_scaled":
        return t + t * 0.3
    if name == "div":
        return t / (ag.relu(t) + 0.7)
    if name == "sub_row":
        return t - t[:1]
    if name == "concatenate":
        return ag.concatenate([t, t * 0.5], axis=1)
    if name in ("log", "sqrt"):
        return getattr(ag, name)(ag.relu(t) + 0.5)
    return getattr(ag, name)(t)


@settings(max_examples=120, deadline=None)
@given(fmt=st.sampled_from(FORMATS), name=st.sampled_from(UNARY),
       data=hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4)),
                       elements=st.floats(-300, 300, allow_nan=False, width=64)))
def test_every_unary_op_output_and_gradient_lie_in_their_formats(fmt, name, data):
    policy = Policy(param=fmt, input=fmt, matmul=fmt, wide=None, loss=None, elementwise=None,
                    name=f"{fmt}-true")
    with use_policy(policy), np.errstate(over="ignore", invalid="ignore"):
        x = Tensor(data, requires_grad=True)
        out = _apply(name, x)
        assert out.fmt == fmt and _in_format(out.data, fmt)
        out.backward(np.ones(out.shape))
    assert x.grad.fmt == fmt and _in_format(x.grad.data, fmt)


@settings(max_examples=60, deadline=None)
@given(low=st.sampled_from([FP16, BF16, E4M3FN, E5M2]),
       seed=st.integers(0, 2 ** 32 - 1), op=st.sampled_from(["matmul", "linear", "mlp_loss"]))
def test_mixed_policy_outputs_and_gradients_lie_in_their_formats(low, seed, op):
    rng = np.random.default_rng(seed)
    policy = Policy(param=FP32, input=FP32, matmul=low, wide=FP32, loss=FP32, name="mixed")
    with use_policy(policy), np.errstate(over="ignore", invalid="ignore"):
        x = Tensor(rng.standard_normal((3, 4)) * 4, requires_grad=True)
        w = Tensor(rng.standard_normal((2, 4)), requires_grad=True)
        b = Tensor(rng.standard_normal(2), requires_grad=True)
        if op == "matmul":
            out = ag.matmul(x, w.T)
        elif op == "linear":
            out = ag.linear(x, w, b)
        else:
            out = ag.cross_entropy(ag.linear(x, w, b).relu(), [0, 1, 1])
        expected = FP32 if op == "mlp_loss" else low
        assert out.fmt == expected and _in_format(out.data, expected)
        out.backward(np.ones(out.shape))
    for t in (x, w, b):
        if t.grad is not None:
            # fp32 tensors receive the low-format gradient of their low-format copy, widened
            assert t.grad.fmt == FP32 and _in_format(t.grad.data, low)
