"""Every op's backward against central finite differences.

The engine runs in the float64 reference mode ("64-true": no rounding), so the check is on the
calculus, to ~1e-7; a second pass under "32-true" checks the same formulas through the fp32
rounding points with a tolerance that fp32 allows. Each case draws its inputs from its own
seed (its name's CRC-32), so a case's inputs do not depend on which other cases ran, and
``test_every_exported_op_has_a_gradient_check`` reads the ops each case records.
"""
import zlib

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy


def _rand(rng, *shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape)


def _pos(rng, *shape):
    return rng.uniform(0.5, 2.0, shape)


def _away_from_zero(rng, *shape):
    x = rng.uniform(0.2, 2.0, shape)
    return x * rng.choice([-1.0, 1.0], shape)


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _conv1d(x, weight, bias):
    """``nn.Conv1d`` (groups 2, stride 2, padding 1, dilation 2) with these tensors as its
    parameters."""
    layer = nn.Conv1d(4, 4, 3, stride=2, padding=1, dilation=2, groups=2)
    layer.weight, layer.bias = weight, bias
    return layer(x)


# name -> (function of tensors, function of a Generator giving the input arrays)
CASES = {
    "add_broadcast": (lambda a, b: a + b, lambda r: [_rand(r, 3, 4), _rand(r, 4)]),
    "add_broadcast_keepdim": (lambda a, b: a + b, lambda r: [_rand(r, 3, 1), _rand(r, 1, 4)]),
    "sub": (lambda a, b: a - b, lambda r: [_rand(r, 2, 3), _rand(r, 2, 3)]),
    "mul_broadcast": (lambda a, b: a * b, lambda r: [_rand(r, 2, 3, 4), _rand(r, 3, 1)]),
    "div": (lambda a, b: a / b, lambda r: [_rand(r, 3, 4), _away_from_zero(r, 3, 4)]),
    "div_broadcast": (lambda a, b: a / b, lambda r: [_rand(r, 3, 4), _away_from_zero(r, 4)]),
    "neg": (lambda a: -a, lambda r: [_rand(r, 5)]),
    "scalar_ops": (lambda a: (2.5 - a) * 3.0 + a / 4.0 - 1.0 / (a * a + 1.0),
                   lambda r: [_rand(r, 6)]),
    "pow_2": (lambda a: a ** 2, lambda r: [_rand(r, 5)]),
    "pow_half": (lambda a: a ** 0.5, lambda r: [_pos(r, 5)]),
    "pow_neg": (lambda a: a ** -1.5, lambda r: [_pos(r, 5)]),
    "matmul_2d": (lambda a, b: a @ b, lambda r: [_rand(r, 3, 4), _rand(r, 4, 5)]),
    "matmul_batched": (lambda a, b: a @ b, lambda r: [_rand(r, 2, 3, 4), _rand(r, 2, 4, 5)]),
    "matmul_broadcast_batch": (lambda a, b: a @ b,
                               lambda r: [_rand(r, 2, 1, 3, 4), _rand(r, 3, 4, 2)]),
    "matmul_vector": (lambda a, b: a @ b, lambda r: [_rand(r, 4), _rand(r, 4, 3)]),
    "linear": (lambda x, w, b: ag.linear(x, w, b),
               lambda r: [_rand(r, 2, 3, 4), _rand(r, 5, 4), _rand(r, 5)]),
    "linear_nobias": (lambda x, w: ag.linear(x, w), lambda r: [_rand(r, 3, 4), _rand(r, 2, 4)]),
    "conv2d": (lambda x, w, b: ag.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2)),
               lambda r: [_rand(r, 2, 2, 5, 6), _rand(r, 3, 2, 3, 2), _rand(r, 3)]),
    "conv2d_groups": (lambda x, w: ag.conv2d(x, w, groups=2, padding=(2, 0)),
                      lambda r: [_rand(r, 1, 4, 3, 4), _rand(r, 4, 2, 2, 2)]),
    "max_pool2d": (lambda x: ag.max_pool2d(x, 3, stride=2, padding=1),
                   lambda r: [_rand(r, 2, 2, 5, 6)]),
    "avg_pool2d": (lambda x: ag.avg_pool2d(x, (2, 3), stride=1, padding=(1, 1)),
                   lambda r: [_rand(r, 2, 2, 4, 5)]),
    "conv1d_module": (lambda x, w, b: _conv1d(x, w, b),
                      lambda r: [_rand(r, 2, 4, 7), _rand(r, 4, 2, 3), _rand(r, 4)]),
    "adaptive_avg_pool2d": (lambda x: ag.adaptive_avg_pool2d(x, (2, 3)),
                            lambda r: [_rand(r, 2, 2, 5, 7)]),
    "adaptive_avg_pool2d_global": (lambda x: ag.adaptive_avg_pool2d(x, 1),
                                   lambda r: [_rand(r, 2, 3, 3, 4)]),
    "layer_norm": (lambda x, w, b: ag.layer_norm(x, (3, 4), w, b, eps=1e-3),
                   lambda r: [_rand(r, 2, 3, 4), _rand(r, 3, 4), _rand(r, 3, 4)]),
    "group_norm": (lambda x, w, b: ag.group_norm(x, 2, w, b, eps=1e-3),
                   lambda r: [_rand(r, 2, 4, 3, 2), _rand(r, 4), _rand(r, 4)]),
    "group_norm_plain": (lambda x: ag.group_norm(x, 3), lambda r: [_rand(r, 2, 6, 3)]),
    "layer_norm_plain": (lambda x: ag.layer_norm(x, 5), lambda r: [_rand(r, 3, 5)]),
    "silu": (lambda a: ag.silu(a), lambda r: [_rand(r, 6, low=-6.0, high=6.0)]),
    "sum_all": (lambda a: a.sum(), lambda r: [_rand(r, 3, 4)]),
    "sum_axis_keepdims": (lambda a: a.sum(axis=1, keepdims=True), lambda r: [_rand(r, 3, 4, 2)]),
    "sum_axes": (lambda a: a.sum(axis=(0, 2)), lambda r: [_rand(r, 3, 4, 2)]),
    "mean_axis": (lambda a: a.mean(axis=0), lambda r: [_rand(r, 3, 4)]),
    "mean_all": (lambda a: a.mean(), lambda r: [_rand(r, 3, 4)]),
    "max_axis": (lambda a: a.max(axis=1), lambda r: [_rand(r, 3, 5)]),
    "max_all": (lambda a: a.max(), lambda r: [_rand(r, 3, 5)]),
    "exp": (lambda a: a.exp(), lambda r: [_rand(r, 5)]),
    "log": (lambda a: a.log(), lambda r: [_pos(r, 5)]),
    "sqrt": (lambda a: a.sqrt(), lambda r: [_pos(r, 5)]),
    "tanh": (lambda a: a.tanh(), lambda r: [_rand(r, 5)]),
    "sigmoid": (lambda a: a.sigmoid(), lambda r: [_rand(r, 5) * 4]),
    "relu": (lambda a: a.relu(), lambda r: [_away_from_zero(r, 6)]),
    "gelu": (lambda a: a.gelu(), lambda r: [_rand(r, 6)]),
    "leaky_relu": (lambda a: ag.leaky_relu(a, 0.2), lambda r: [_away_from_zero(r, 6)]),
    "elu": (lambda a: ag.elu(a, 1.5), lambda r: [_away_from_zero(r, 8) * 2]),
    "gelu_tanh": (lambda a: a.gelu("tanh"), lambda r: [_rand(r, 8, low=-4.0, high=4.0)]),
    "where": (lambda a, b: ag.where(np.array([[True, False, True], [False, False, True]]),
                                    a, b) * b,
              lambda r: [_rand(r, 2, 3), _rand(r, 3)]),
    "where_scalar": (lambda a: ag.where(np.array([True, False, True]), 0.5, a),
                     lambda r: [_rand(r, 2, 3)]),
    "dropout": (lambda a: ag.dropout(a, 0.4, seed=3, offset=5) * a, lambda r: [_rand(r, 4, 5)]),
    "batch_norm_train": (lambda x, w, b: ag.batch_norm(x, None, None, w, b, training=True),
                         lambda r: [_rand(r, 3, 2, 2, 2), _rand(r, 2), _rand(r, 2)]),
    "batch_norm_eval": (lambda x, w, b: ag.batch_norm(x, Tensor([0.3, -0.2]), Tensor([0.5, 2.0]),
                                                      w, b),
                        lambda r: [_rand(r, 3, 2, 2), _rand(r, 2), _rand(r, 2)]),
    "masked_fill": (lambda a: a.masked_fill(np.array([[False], [True]]), -1.5) * a,
                    lambda r: [_rand(r, 2, 3)]),
    "softmax": (lambda a: a.softmax(axis=-1), lambda r: [_rand(r, 3, 5)]),
    "softmax_axis0": (lambda a: a.softmax(axis=0), lambda r: [_rand(r, 3, 5)]),
    "log_softmax": (lambda a: a.log_softmax(axis=1), lambda r: [_rand(r, 3, 5)]),
    "reshape": (lambda a, b: a.reshape(4, 3) * b, lambda r: [_rand(r, 3, 4), _rand(r, 4, 3)]),
    "transpose": (lambda a: a.transpose(2, 0, 1), lambda r: [_rand(r, 2, 3, 4)]),
    "T": (lambda a: a.T @ a, lambda r: [_rand(r, 3, 2)]),
    "getitem_slice": (lambda a: a[1:, ::2], lambda r: [_rand(r, 3, 5)]),
    "getitem_repeated_index": (lambda a: a[np.array([0, 2, 0, 0])], lambda r: [_rand(r, 3, 4)]),
    "concatenate": (lambda a, b: ag.concatenate([a, b, a], axis=1),
                    lambda r: [_rand(r, 2, 3), _rand(r, 2, 1)]),
    "stack": (lambda a, b: ag.stack([a, b], axis=1), lambda r: [_rand(r, 2, 3), _rand(r, 2, 3)]),
    "cross_entropy": (lambda a: ag.cross_entropy(a, [1, 0, 3]), lambda r: [_rand(r, 3, 4)]),
    "cross_entropy_sum": (lambda a: ag.cross_entropy(a, [1, 0, 3], reduction="sum"),
                          lambda r: [_rand(r, 3, 4)]),
    "mse_loss": (lambda a, b: ag.mse_loss(a, b), lambda r: [_rand(r, 3, 4), _rand(r, 3, 4)]),
    "mlp": (lambda x, w, b: ag.cross_entropy(ag.linear(x, w, b).tanh(), [0, 2]),
            lambda r: [_rand(r, 2, 4), _rand(r, 3, 4), _rand(r, 3)]),
    # a cast to float64: recorded in "32-true" (exp casts back to fp32); "64-true" has no cast
    "cast": (lambda a: ag.cast(a, "fp64").exp(), lambda r: [_rand(r, 5)]),
}


def _numeric_grads(fn, arrays, weights, h):
    def value(arrs):
        with ag.no_grad():
            out = fn(*[Tensor(a) for a in arrs])
            return float(np.sum(backend.to_numpy(out.data) * weights))

    grads = []
    for i, base in enumerate(arrays):
        g = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[i][idx] += h
            minus[i][idx] -= h
            g[idx] = (value(plus) - value(minus)) / (2 * h)
        grads.append(g)
    return grads


def _analytic_grads(fn, arrays, weights):
    tensors = [Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    (out * Tensor(weights)).sum().backward()
    return out, [t.grad.data for t in tensors]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_float64_reference(name):
    fn, make = CASES[name]
    rng = _rng(name)
    arrays = make(rng)
    with use_policy("64-true"):
        with ag.no_grad():
            shape = fn(*[Tensor(a) for a in arrays]).shape
        weights = rng.uniform(0.5, 1.5, shape)
        out, analytic = _analytic_grads(fn, arrays, weights)
        assert out.data.dtype == backend.xp.float64
        numeric = _numeric_grads(fn, arrays, weights, 1e-6)
    for a, n in zip(analytic, numeric):
        assert a.dtype == backend.xp.float64
        a = backend.to_numpy(a)
        np.testing.assert_allclose(a, n, rtol=1e-6, atol=1e-7, err_msg=name)


FP32_CASES = ["cast", "add_broadcast", "mul_broadcast", "div", "matmul_batched", "linear", "conv2d",
              "conv1d_module", "group_norm",
              "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "layer_norm", "silu", "sum_axes",
              "mean_axis", "exp", "log", "tanh", "sigmoid", "gelu", "gelu_tanh", "where",
              "leaky_relu", "elu",
              "masked_fill", "dropout", "batch_norm_train", "batch_norm_eval", "softmax",
              "log_softmax",
              "getitem_repeated_index", "cross_entropy", "mse_loss", "mlp"]


@pytest.mark.parametrize("name", FP32_CASES)
def test_gradient_fp32_policy(name):
    """The same formulas through fp32 rounding: analytic (fp32) vs float64 differences."""
    fn, make = CASES[name]
    rng = _rng(name)
    arrays = make(rng)
    with use_policy("64-true"):
        with ag.no_grad():
            shape = fn(*[Tensor(a) for a in arrays]).shape
        weights = rng.uniform(0.5, 1.5, shape)
        numeric = _numeric_grads(fn, arrays, weights, 1e-6)
    with use_policy("32-true"):
        out, analytic = _analytic_grads(fn, arrays, weights.astype(np.float32))
    assert out.fmt.name == "fp32" and out.data.dtype == backend.xp.float32
    for a, n in zip(analytic, numeric):
        assert a.dtype == backend.xp.float32
        a = backend.to_numpy(a)
        np.testing.assert_allclose(a, n, rtol=2e-4, atol=2e-5, err_msg=name)


def _recorded_ops(tensor) -> set:
    """The op names in ``tensor``'s graph (``cast[fp16]`` counts as ``cast``)."""
    seen, stack, ops = set(), [tensor], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node._op is not None:
            ops.add(node._op.split("[")[0])
        stack.extend(node._parents)
    return ops


def test_every_exported_op_has_a_gradient_check():
    """Each op that ``fpsim.autograd`` exports appears in the graph of some case above, in
    the float64 pass or the fp32 pass (a new op without a gradient check fails here)."""
    exported = {name for name in ag.__all__ if name.islower() and callable(getattr(ag, name))
                and name not in {"current_policy", "use_policy", "set_default_policy",
                                 "no_grad", "enable_grad", "is_grad_enabled", "get_policy",
                                 "as_tensor"}}
    recorded = set()
    for name, (fn, make) in CASES.items():
        for policy in ("64-true", "32-true"):
            with use_policy(policy):
                tensors = [Tensor(a, requires_grad=True) for a in make(_rng(name))]
                recorded |= _recorded_ops(fn(*tensors))
    aliases = {"matmul_op": "matmul"}
    recorded = {aliases.get(op, op) for op in recorded}
    assert exported - recorded == set(), f"ops without a gradient check: {exported - recorded}"
