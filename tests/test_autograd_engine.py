"""Engine semantics: where values and gradients are rounded, graph bookkeeping, errors."""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, round_to
from fpsim.autograd import FP64, Policy, Tensor, no_grad, use_policy
from fpsim.autograd.numerics import contains, round_array, widest
from fpsim.formats import BF16, E4M3FN, E5M2, FP16, FP32, TF32


def _in_format(array, fmt) -> bool:
    array = backend.to_numpy(array)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array_equal(round_to(array, fmt).view(np.uint32), array.view(np.uint32))


# --- rounding helpers ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN, TF32, FP32])
@pytest.mark.parametrize("n", [7, 1 << 15])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_array_fast_paths_match_round_to(fmt, n, dtype):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, n)).astype(dtype)
    x[:4] = [np.inf, -np.inf, 1e6, -0.0]
    with np.errstate(over="ignore", invalid="ignore"):
        expected = round_to(x, fmt).astype(np.float32)
        got = round_array(backend.asarray(x, getattr(backend.xp, np.dtype(dtype).name)), fmt)
    assert got.dtype == backend.xp.float32
    got = backend.to_numpy(got)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_round_array_rounds_float64_once_not_through_float32():
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 3 * 2.0 ** -26 + 2.0 ** -60])
    x64 = backend.asarray(x, backend.xp.float64)
    x32 = backend.asarray(x.astype(np.float32), backend.xp.float32)
    np.testing.assert_array_equal(backend.to_numpy(round_array(x64, FP16)),
                                  [1 + 2.0 ** -10, 2.0 ** -24])
    np.testing.assert_array_equal(backend.to_numpy(round_array(x32, FP16)), [1.0, 2.0 ** -24])


def test_contains_and_widest():
    assert contains(FP32, FP16) and contains(FP32, BF16) and contains(FP16, E4M3FN)
    assert not contains(FP16, BF16) and not contains(BF16, FP16) and not contains(FP16, FP32)
    assert contains(FP64, FP32) and not contains(FP32, FP64)
    assert widest(FP16, BF16) == FP32 and widest(E5M2, FP16) == FP16
    assert widest(FP16, FP16.replace(subnormals=False)) == FP16


# --- the phenomenon: gradients stored in the low format -----------------------------------------
def test_activation_gradient_underflows_in_fp16_but_not_in_fp32():
    def grad_of_x(policy):
        with use_policy(policy):
            x = Tensor([1.0], requires_grad=True)
            y = x * 2.0 ** -14
            (y * 2.0 ** -14).sum().backward()
            return x.grad

    g32, g16 = grad_of_x("32-true"), grad_of_x("16-true")
    assert backend.to_numpy(g32.data)[0] == 2.0 ** -28 and g32.fmt == FP32
    # below fp16's 2**-24: underflow
    assert backend.to_numpy(g16.data)[0] == 0.0 and g16.fmt == FP16


def test_16_mixed_linear_sends_fp16_gradients_to_fp32_weights():
    rng = np.random.default_rng(0)
    with use_policy("16-mixed"):
        w = Tensor(rng.standard_normal((4, 3)) * 1e-3, requires_grad=True)
        x = Tensor(rng.standard_normal((5, 3)), requires_grad=True)
        y = ag.linear(x, w)
        assert y.fmt == FP16 and w.fmt == FP32 and x.fmt == FP32
        (y * 1e-6).sum().backward()
    assert w.grad.fmt == FP32 and x.grad.fmt == FP32
    assert _in_format(w.grad.data, FP16) and _in_format(x.grad.data, FP16)
    # x's gradient: sum_j 1e-6 (fp16) * w (fp16, ~1e-3) ~ 1e-9 < 2**-24 / 2: flushes to zero
    assert np.count_nonzero(backend.to_numpy(x.grad.data)) == 0
    with use_policy("32-true"):
        x32 = Tensor(x.data, requires_grad=True)
        (ag.linear(x32, Tensor(w.data)) * 1e-6).sum().backward()
    assert np.count_nonzero(backend.to_numpy(x32.grad.data)) == x32.size


def test_policy_grad_format_override_stores_every_gradient_in_it():
    with use_policy(ag.get_policy("32-true").replace(grad="e5m2")):
        x = Tensor([0.3, 1.7], requires_grad=True)
        y = x.exp()
        assert y.grad_fmt == E5M2 and x.grad_fmt == E5M2
        y.sum().backward()
    assert x.grad.fmt == E5M2 and _in_format(x.grad.data, E5M2)


def test_op_output_formats_follow_the_16_mixed_categories():
    with use_policy("16-mixed"):
        a = Tensor(np.ones((2, 3)))                 # fp32 input
        h = ag.matmul(a, Tensor(np.ones((3, 2))))  # matmul category -> fp16
        assert h.fmt == FP16
        assert (h + a[:, :2]).fmt == FP32            # promote: fp16 with fp32 -> fp32
        assert (h * 2.0).fmt == FP16                 # Python scalars do not promote
        assert h.relu().fmt == FP16 and h.tanh().fmt == FP16 and h.mean().fmt == FP16
        assert h.sum().fmt == FP32 and h.exp().fmt == FP32 and h.softmax().fmt == FP32
        assert h.log_softmax().fmt == FP32 and (h ** 2).fmt == FP32
        assert ag.cross_entropy(h, [0, 1]).fmt == FP32
        assert ag.mse_loss(h, h).fmt == FP32


def test_16_true_keeps_everything_in_fp16():
    with use_policy("16-true"):
        a = Tensor(np.ones((2, 3)), requires_grad=True)
        loss = ag.cross_entropy(ag.matmul(a, Tensor(np.ones((3, 2)))).softmax(), [0, 1])
        assert a.fmt == FP16 and loss.fmt == FP16
        loss.backward()
    assert a.grad.fmt == FP16


def test_matmul_accumulation_argument_and_policy_default():
    ones_a = np.ones((1, 4096))
    ones_b = np.ones((4096, 1))
    with use_policy("32-true"):
        exact = ag.matmul(Tensor(ones_a), Tensor(ones_b))
        stalled = ag.matmul(Tensor(ones_a), Tensor(ones_b), accumulation="sequential:fp16")
    with use_policy(ag.get_policy("32-true").replace(accumulation="sequential:fp16")):
        by_policy = ag.matmul(Tensor(ones_a), Tensor(ones_b))
        summed = Tensor(np.ones(4096)).sum()
    assert exact.item() == 4096.0 and stalled.item() == 2048.0 and by_policy.item() == 2048.0
    assert summed.item() == 2048.0


def test_transcendentals_are_rounded_once_from_float64():
    x = np.linspace(-4, 4, 1001, dtype=np.float32)
    with use_policy("32-true"):
        for name, f64 in [("exp", np.exp), ("tanh", np.tanh), ("log", np.log)]:
            arg = np.abs(x) + 0.5 if name == "log" else x
            got = backend.to_numpy(getattr(Tensor(arg), name)().data)
            np.testing.assert_array_equal(got, f64(arg.astype(np.float64)).astype(np.float32))
    with use_policy("16-true"):
        got = backend.to_numpy(Tensor(x).tanh().data)
    np.testing.assert_array_equal(got, round_to(np.tanh(round_to(x, FP16).astype(np.float64)),
                                                FP16).astype(np.float32))


def _round_fraction(value, fmt):
    """A Fraction rounded once to nearest-even fp32 or fp16 by MPFR (subnormals, overflow)."""
    gmpy2 = pytest.importorskip("gmpy2")
    precision, emin, emax = (24, -148, 128) if fmt == "fp32" else (11, -23, 16)
    ctx = gmpy2.context(precision=precision, emin=emin, emax=emax, subnormalize=True)
    with gmpy2.context(ctx):
        return np.float32(float(gmpy2.mpfr(gmpy2.mpq(value.numerator, value.denominator))))


def _exact_mse(pred, target, reduction, fmt):
    from fractions import Fraction
    squares = [(Fraction(float(p)) - Fraction(float(t))) ** 2
               for p, t in zip(np.ravel(pred), np.ravel(target))]
    if reduction == "none":
        return np.array([_round_fraction(v, fmt) for v in squares], np.float32)
    total = sum(squares, Fraction(0))
    return _round_fraction(total / len(squares) if reduction == "mean" else total, fmt)


@pytest.mark.parametrize("pred, target, reduction, fmt", [
    # the audit's case: S = 1 + 2**-24 + 2**-80; float64 drops 2**-80 and ties to 1.0
    ([1.0, 2.0 ** -12, 2.0 ** -40], [0.0, 0.0, 0.0], "sum", "fp32"),
    # p - t inexact in float64: (1 + 2**-12 + 2**-60)**2 is just past the fp32 midpoint
    # (1 + 2**-12)**2 = 1 + 2**-11 + 2**-24 that float64 gives
    ([1.0 + 2.0 ** -12, 0.0], [-(2.0 ** -60), 0.0], "sum", "fp32"),
    ([1.0 + 2.0 ** -12], [-(2.0 ** -60)], "none", "fp32"),
    # mean: S = 5 (1 + 2**-24) + 2**-80; float64 drops 2**-80, and S / 5 ties to 1.0
    ([2.0, 1.0, 2.0 ** -11, 2.0 ** -12, 2.0 ** -40], [0.0] * 5, "mean", "fp32"),
    # fp16 values: S = 2**15 + 2**4 (an fp16 midpoint) + 2**-48, beyond float64's 53 bits
    ([128.0, 128.0, 4.0, 2.0 ** -24], [0.0] * 4, "sum", "fp16"),
])
def test_mse_loss_is_the_exact_value_rounded_once(pred, target, reduction, fmt):
    pred, target = np.float32(pred), np.float32(target)
    with use_policy(Policy(loss=fmt)):
        got = backend.to_numpy(ag.mse_loss(Tensor(pred), Tensor(target), reduction).data)
    np.testing.assert_array_equal(got, _exact_mse(pred, target, reduction, fmt))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_the_exact_oracle_on_random_data(seed, reduction):
    rng = np.random.default_rng(seed)
    n = [7, 12, 16, 30, 1, 5][seed]
    pred = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 20, n)).astype(np.float32)
    target = np.where(rng.random(n) < 0.5, pred, rng.standard_normal(n)).astype(np.float32)
    target[::3] = pred[::3] * (1 + 2.0 ** -23)       # near cancellation
    got = backend.to_numpy(ag.mse_loss(Tensor(pred), Tensor(target), reduction).data)
    np.testing.assert_array_equal(got, _exact_mse(pred, target, reduction, "fp32"))


def test_cast_rounds_forward_and_widens_backward():
    w = Tensor([1.0 + 2.0 ** -12, 3.0], "fp32", requires_grad=True)
    h = w.cast("fp16")
    assert backend.to_numpy(h.data)[0] == 1.0 and h.fmt == FP16
    (h * Tensor([2.0 ** -20, 1.0], "fp16")).sum().backward()
    assert w.grad.fmt == FP32 and backend.to_list(w.grad.data) == [2.0 ** -20, 1.0]


def test_reference_mode_uses_float64_containers():
    with use_policy("64-true"):
        t = Tensor([0.1], requires_grad=True)
        (t * 3.0).sum().backward()
    assert t.fmt is FP64 and t.data.dtype == backend.xp.float64
    assert backend.to_numpy(t.data)[0] == 0.1
    assert t.grad.data.dtype == backend.xp.float64


# --- graph bookkeeping ----------------------------------------------------------------------------
def test_gradients_accumulate_across_backward_calls_until_zero_grad():
    x = Tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3):
        (x * x).sum().backward()
    np.testing.assert_array_equal(backend.to_numpy(x.grad.data), [6.0, 12.0])
    x.zero_grad()
    assert x.grad is None
    (x * 5.0).sum().backward()
    np.testing.assert_array_equal(backend.to_numpy(x.grad.data), [5.0, 5.0])


def test_tensor_used_twice_sums_both_paths():
    x = Tensor([3.0], requires_grad=True)
    y = x * x + x.exp() + x
    y.sum().backward()
    assert backend.to_numpy(x.grad.data)[0] == np.float32(6.0 + np.float32(np.exp(3.0)) + 1.0)


def test_no_grad_detach_and_requires_grad():
    x = Tensor([1.0], requires_grad=True)
    with no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.is_leaf
    d = (x * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    z = Tensor([1.0]) * 2.0
    assert not z.requires_grad


def test_retain_grad_keeps_an_activation_gradient():
    with use_policy("16-true"):
        x = Tensor([1.0, 2.0], requires_grad=True)
        h = (x * 2.0).retain_grad()
        (h * 3.0).sum().backward()
    assert h.grad.fmt == FP16 and backend.to_list(h.grad.data) == [3.0, 3.0]


def test_second_backward_through_freed_graph_is_an_error_unless_retained():
    x = Tensor([1.0], requires_grad=True)
    y = (x.exp() * 2.0).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert backend.to_numpy(x.grad.data)[0] == np.float32(4 * np.float32(np.e))
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


# --- errors ---------------------------------------------------------------------------------------
def test_backward_on_non_scalar_needs_a_seed():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    y = x * 2.0
    with pytest.raises(ValueError, match=r"non-scalar.*\(2, 3\)"):
        y.backward()
    y.backward(np.ones((2, 3)))
    with pytest.raises(ValueError, match="seed gradient shape"):
        (x * 2.0).backward(np.ones(3))
    with pytest.raises(ValueError, match="does not require grad"):
        Tensor([1.0]).backward()


@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b,
                                lambda a, b: a / b])
def test_broadcast_mismatch_names_both_shapes(op):
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
        op(Tensor(np.ones((2, 3))), Tensor(np.ones(4)))


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\).*3 and 4"):
        ag.matmul(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5))))
    with pytest.raises(ValueError, match=r"input shape \(2, 3\) and weight shape \(4, 5\)"):
        ag.linear(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5))))
    with pytest.raises(ValueError, match=r"cannot reshape shape \(2, 3\)"):
        Tensor(np.ones((2, 3))).reshape(4, 2)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        ag.cross_entropy(Tensor(np.ones((2, 3))), [0, 3])
    with pytest.raises(ValueError, match=r"prediction shape \(2,\) != target shape \(3,\)"):
        ag.mse_loss(Tensor(np.ones(2)), Tensor(np.ones(3)))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        Tensor(np.ones((2, 3))).sum(axis=2)
    with pytest.raises(TypeError, match="real numbers"):
        Tensor(["a"])


def test_policy_object_and_custom_formats_work_in_ops():
    p = Policy(param="fp32", input="fp32", matmul="e4m3", wide="fp32", loss="fp32",
               elementwise=None, name="fp8-matmul")
    with use_policy(p):
        y = ag.matmul(Tensor([[0.3, 0.7]]), Tensor([[1.1], [2.9]]))
    assert y.fmt == E4M3FN and _in_format(y.data, E4M3FN)


def test_numpy_arrays_on_the_left_defer_to_tensor_operators():
    t = Tensor([1.0, 2.0], requires_grad=True)
    y = np.ones(2) * t + np.array([1.0, 1.0]) - t / np.array([2.0, 2.0])
    assert isinstance(y, Tensor) and y.requires_grad
    y.sum().backward()
    np.testing.assert_array_equal(backend.to_numpy(t.grad.data), [0.5, 0.5])


def test_linear_with_infinite_inputs_gives_nan_without_warnings():
    import numpy as np

    from fpsim.autograd import Tensor, linear, use_policy

    with use_policy("16-true"):
        out = linear(Tensor(np.ones((2, 3), np.float32)),
                     Tensor(np.full((2, 3), np.inf, np.float32)),
                     Tensor(np.full((2,), -np.inf, np.float32)))
    assert np.isnan(backend.to_numpy(out.data)).all()


@pytest.mark.parametrize("residual_first", [True, False])
def test_a_residual_gets_the_gradient_of_both_paths(residual_first):
    """``a + f(a)``: the gradient through ``f`` reaches ``a`` whichever operand comes first
    (fpsim before 0.2 ordered the graph so that with ``a`` first it was dropped)."""
    with use_policy("64-true"):
        a = Tensor(np.array([0.5, -1.5]), requires_grad=True)
        branch = (a * 3.0).tanh()
        ((a + branch) if residual_first else (branch + a)).sum().backward()
    expected = 1.0 + 3.0 * (1.0 - np.tanh(3.0 * np.array([0.5, -1.5])) ** 2)
    np.testing.assert_allclose(backend.to_numpy(a.grad.data), expected, rtol=1e-13)


def test_a_chain_of_residual_blocks_matches_torch_in_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x0, w = rng.normal(size=(3, 4)), rng.normal(size=(4, 4)) * 0.5
    with use_policy("64-true"):
        x = Tensor(x0, requires_grad=True)
        weight = Tensor(w, requires_grad=True)
        h = x
        for _ in range(3):
            h = h + (h @ weight).tanh()
        (h * h).sum().backward()
    tx = torch.tensor(x0, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    th = tx
    for _ in range(3):
        th = th + (th @ tw).tanh()
    (th * th).sum().backward()
    np.testing.assert_allclose(backend.to_numpy(x.grad.data), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(backend.to_numpy(weight.grad.data), tw.grad.numpy(), rtol=1e-12)
