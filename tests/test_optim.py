"""Master weights, lost updates, loss-scale skips, clipping, checkpoints and bad input."""
import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor
from fpsim.optim import SGD, Adam, Arith, Optimizer
from fpsim.scaling import preset
from fpsim.train import load_checkpoint, save_checkpoint


def weights(values, fmt="fp16"):
    return Tensor(np.float32(values), fmt, requires_grad=True)


def set_grad(w, values, fmt="fp16"):
    w.grad = Tensor(np.float32(values), fmt)


def host(array):
    """An engine array (a parameter's data, an Arith result) as a host NumPy array."""
    return backend.to_numpy(array)


def f32(values):
    """float32 operands for Arith, as arrays of the backend (0-d for a scalar)."""
    return backend.asarray(np.float32(values), backend.xp.float32)


@pytest.mark.parametrize("ratio,lost", [(1024, False), (2048, True), (4096, True)])
def test_fp16_update_swamping_at_the_2048_ratio(ratio, lost):
    # w = 1 in fp16 has ulp 2**-10 above it; an increment of w/ratio is lost when below half
    # an ulp, i.e. ratio >= 2048 (the tie at exactly 2048 rounds to even: back to 1).
    w = weights([1.0])
    set_grad(w, [-1.0 / ratio])
    report = Optimizer([w], SGD(lr=1.0), master=None).step()
    assert bool(host(w.data)[0] == 1.0) is lost
    assert report.lost_updates == int(lost) and report.updates == 1


def test_master_copy_accumulates_what_fp16_loses():
    w16, wm = weights([1.0] * 4), weights([1.0] * 4)
    direct = Optimizer([w16], SGD(lr=1.0), master=None)
    master = Optimizer([wm], SGD(lr=1.0))
    for _ in range(100):
        set_grad(w16, [-2.0 ** -12] * 4)
        set_grad(wm, [-2.0 ** -12] * 4)
        lost_direct = direct.step().lost_fraction
        master.step()
    assert lost_direct == 1.0 and host(w16.data)[0] == 1.0         # fp16 never moves
    assert host(master.masters["0"])[0] == np.float32(1 + 100 * 2.0 ** -12)
    assert host(wm.data)[0] == np.float32(1 + 25 * 2.0 ** -10)    # fp16 of the master


def test_scaler_skips_overflowing_steps_and_unscales():
    w = weights([1.0, 2.0], "fp32")
    opt = Optimizer([w], SGD(lr=0.5))
    state = preset("torch", init_scale=1024.0).init()
    set_grad(w, [np.inf, 1.0], "fp32")
    report = opt.step(state)
    assert report.skipped and report.found_inf and backend.to_list(w.data) == [1.0, 2.0]
    assert report.scaler_state.scale == 512.0 and opt.step_count == 0
    set_grad(w, [512.0, -1024.0], "fp32")                           # scaled by 512
    report = opt.step(report.scaler_state)
    assert not report.skipped and backend.to_list(w.data) == [0.5, 3.0]  # unscaled: 1, -2
    assert report.grad_norm == np.float32(np.sqrt(5.0)) and report.scale == 512.0


def test_without_a_scaler_overflow_is_reported_not_skipped():
    w = weights([1.0], "fp32")
    set_grad(w, [np.nan], "fp32")
    report = Optimizer([w], SGD(lr=0.1)).step()
    assert report.found_inf and not report.skipped and np.isnan(host(w.data)[0])


def test_clipping_by_global_norm():
    w = weights([0.0, 0.0], "fp32")
    set_grad(w, [3.0, 4.0], "fp32")
    report = Optimizer([w], SGD(lr=1.0), clip_norm=1.0).step()
    coef = np.float32(1.0) / (np.float32(5.0) + np.float32(1e-6))
    assert report.clipped and report.grad_norm == 5.0
    assert backend.to_list(w.data) == [-(np.float32(3.0) * coef), -(np.float32(4.0) * coef)]


def test_resume_from_checkpoint_gives_the_same_bits(tmp_path):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(64).astype(np.float32) for _ in range(10)]
    init = rng.standard_normal(64).astype(np.float32)

    def fresh():
        w = weights(init)
        return w, Optimizer([("w", w)], Adam(lr=1e-2))

    w_a, opt_a = fresh()
    for g in grads:
        set_grad(w_a, g)
        opt_a.step()
    w_b, opt_b = fresh()
    for g in grads[:4]:
        set_grad(w_b, g)
        opt_b.step()
    save_checkpoint(tmp_path / "c.npz", {**opt_b.state_dict(), "param/w": w_b.data}, {})
    w_c, opt_c = fresh()
    arrays, _ = load_checkpoint(tmp_path / "c.npz")
    w_c.data = backend.asarray(arrays.pop("param/w"), backend.xp.float32)
    opt_c.load_state_dict(arrays)
    for g in grads[4:]:
        set_grad(w_c, g)
        opt_c.step()
    assert np.array_equal(host(w_a.data).view(np.uint32), host(w_c.data).view(np.uint32))


def test_arith_rounds_once_per_operation():
    ops = Arith("fp16")
    # 1 + 2**-11 + 2**-22 is above the fp16 tie: fused, one rounding -> 1 + 2**-10
    assert host(ops.fma(f32(2.0 ** -11), f32(1 + 2.0 ** -11), f32(1.0))) == \
        np.float32(1 + 2.0 ** -10)
    # unfused: the product rounds to 2**-11 first, the sum ties to even -> 1
    assert host(ops.add(ops.mul(f32(2.0 ** -11), f32(1 + 2.0 ** -11)), 1.0)) == 1.0
    # lerp from 0 to 1 by 0.1: fma(w, 1 - 0, 0) = w, the weight as an fp16 value
    assert host(ops.lerp(f32([0.0]), f32([1.0]), 0.1))[0] == host(ops.scalar(0.1))
    assert host(ops.scalar(0.1)) == np.float32(0.0999755859375)


@pytest.mark.parametrize("fmt, a, b, expected", [
    # fp32 operands (gradients) under a narrower format: the float64 sum drops the tiny
    # operand, so rounding it again would meet a tie that the exact sum is not on
    ("bf16", 1 + 2.0 ** -8, 2.0 ** -60, 1 + 2.0 ** -7),
    ("bf16", 1 + 3 * 2.0 ** -8, -(2.0 ** -100), 1 + 2.0 ** -7),
    ("fp16", 1 + 2.0 ** -11, 2.0 ** -60, 1 + 2.0 ** -10),
    ("fp16", -(1 + 2.0 ** -11), -(2.0 ** -60), -(1 + 2.0 ** -10)),
    ("fp16", 1 + 2.0 ** -11, -(2.0 ** -60), 1.0),
])
def test_arith_add_and_sub_of_fp32_operands_round_once(fmt, a, b, expected):
    ops = Arith(fmt)
    a32, b32 = f32([a]), f32([b])
    assert host(ops.add(a32, b32))[0] == np.float32(expected)
    assert host(ops.sub(a32, -b32))[0] == np.float32(expected)
    assert host(ops.sub(f32(a), f32(-b))) == np.float32(expected)     # 0-d
    # NaN keeps the sign IEEE float64 subtraction gives it
    nan = host(ops.sub(f32([1.0]), f32([np.nan])))[0]
    assert np.isnan(nan) and not np.signbit(nan)


@pytest.mark.parametrize("make,message", [
    (lambda: SGD(lr=0.0), "lr must be a number in \\(0"),
    (lambda: SGD(lr=-1.0), "lr must be"),
    (lambda: SGD(lr=0.1, momentum=-0.5), "momentum"),
    (lambda: SGD(lr=0.1, nesterov=True), "nesterov=True needs momentum"),
    (lambda: Adam(lr=1e-3, beta1=1.0), "beta1"),
    (lambda: Adam(lr=1e-3, eps=0.0), "eps"),
    (lambda: Adam(lr=float("nan")), "lr"),
    (lambda: Optimizer([], SGD(lr=0.1)), "no parameters"),
    (lambda: Optimizer([weights([1.0])], SGD(lr=0.1), clip_norm=0.0), "clip_norm"),
    # allowed values that float32, the widest update arithmetic, turns into refused ones
    (lambda: SGD(lr=1e-50), "lr=1e-50 is 0.0 in float32"),
    (lambda: SGD(lr=1e39), "lr=1e\\+39 is inf in float32"),
    (lambda: Adam(lr=1e-3, eps=1e-50), "eps=1e-50 is 0.0 in float32"),
    (lambda: Adam(lr=1e-3, beta2=1 - 1e-10), "beta2=.* is 1.0 in float32"),
    (lambda: Optimizer([weights([1.0])], SGD(lr=0.1), clip_norm=1e-60), "is 0.0 in float32"),
    (lambda: Optimizer([weights([1.0])], SGD(lr=0.1), clip_norm=True), "clip_norm must be"),
    (lambda: SGD(lr=0.1, momentum=True), "momentum must be"),
    (lambda: SGD(lr=0.1, momentum=0.9, nesterov="yes"), "nesterov must be True or False"),
    (lambda: Adam(lr=1e-3, decoupled=1), "decoupled must be True or False"),
    (lambda: Optimizer([weights([0.1], "fp32")], SGD(lr=0.1), master="fp16"), "does not fit"),
    (lambda: Optimizer([np.ones(3)], SGD(lr=0.1)), "not a Tensor"),
])
def test_bad_input_is_refused_clearly(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_numpy_scalars_and_float32_subnormals_are_accepted():
    assert SGD(lr=np.float32(0.1)).lr == np.float32(0.1)
    assert Adam(lr=1e-3, eps=2.0 ** -149).eps == 2.0 ** -149     # float32's smallest: kept
    Optimizer([weights([1.0])], SGD(lr=0.1), clip_norm=np.float64(2.0))
