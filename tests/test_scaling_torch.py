"""fpsim.scaling against real PyTorch: torch._amp_update_scale_, GradScaler("cpu") end to end,
and the unscale/scale numerics, bit for bit, every step."""
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from fpsim.scaling import (ScalerState, check_overflow, found_inf, preset,  # noqa: E402
                           scale_loss, unscale)


def f32_bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def assert_same_bits(ours, theirs, msg=""):
    """Equal bits everywhere except NaN payloads: NaN must meet NaN (fpsim's bfloat16
    rounding returns the canonical NaN; torch keeps the top payload bits)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    nan = np.isnan(ours)
    np.testing.assert_array_equal(nan, np.isnan(theirs), err_msg=msg)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32),
                                  err_msg=msg)


def patterns(seed=0):
    """Named overflow patterns: (name, flags, growth_interval)."""
    rng = np.random.default_rng(seed)
    out = []
    for rate, interval in ((0.001, 50), (0.01, 7), (0.1, 3), (0.5, 2), (0.9, 1), (0.05, 20)):
        out.append((f"random p={rate} interval={interval}", rng.random(4000) < rate, interval))
    bursts = np.zeros(6000, bool)
    for start in rng.integers(0, 5900, 40):
        bursts[start:start + rng.integers(1, 30)] = True
    out.append(("bursts", bursts, 25))
    clean = np.zeros(10_000, bool)
    clean[[1999, 2000, 5000, 7001]] = True          # around the default interval
    out.append(("long clean runs, interval 2000", clean, 2000))
    collapse = np.concatenate([np.ones(200, bool), np.zeros(50, bool)])
    out.append(("overflow every step: collapse to 0 and stay", collapse, 3))
    out.append(("growth to the float32 limit", np.zeros(300, bool), 1))
    up_down = np.tile(np.array([False] * 5 + [True]), 400)
    out.append(("grow/backoff see-saw", up_down, 5))
    return out


ALL_PATTERNS = patterns()


def test_patterns_are_long_enough():
    assert sum(len(flags) for _, flags, _ in ALL_PATTERNS) >= 10_000


@pytest.mark.parametrize("factors", [(2.0, 0.5), (1.5, 0.3), (3.0, 0.7), (1.0001, 0.9999),
                                     (1.1, 0.125)])
@pytest.mark.parametrize("name,flags,interval", ALL_PATTERNS, ids=[p[0] for p in ALL_PATTERNS])
def test_update_rule_matches_amp_update_scale_kernel(name, flags, interval, factors):
    growth, backoff = factors
    init = 2.0 ** 16 if growth == 2.0 else 1000.1        # 1000.1 is not a float32 value
    scale_t = torch.full((), init, dtype=torch.float32)
    tracker_t = torch.zeros((), dtype=torch.int32)
    yes, no = torch.ones(()), torch.zeros(())
    state = preset("torch", init_scale=init, growth_factor=growth, backoff_factor=backoff,
                   growth_interval=interval).init()
    assert f32_bits(state.scale) == f32_bits(scale_t.item())
    for step, flag in enumerate(flags):
        torch._amp_update_scale_(scale_t, tracker_t, yes if flag else no, growth, backoff,
                                 interval)
        state = state.update(bool(flag))
        assert f32_bits(state.scale) == f32_bits(scale_t.item()), (name, step)
        assert state.growth_tracker == tracker_t.item(), (name, step)
        assert state.skipped == bool(flag)


def test_collapse_and_limit_values():
    """The two ends the patterns reach, checked as values: 0 after 166 halvings of 2**16
    (2**-149 * 0.5 rounds to 0), and 2**127 as the largest scale growth by 2 can reach."""
    state = preset("torch", growth_interval=1).init()
    for _ in range(111):
        state = state.update(False)
    assert state.scale == 2.0 ** 127
    assert state.update(False).scale == 2.0 ** 127
    assert state.update(False).decision.growth_blocked == "nonfinite"
    state = preset("torch").init()
    for _ in range(165):
        state = state.update(True)
    assert state.scale == 2.0 ** -149
    assert state.update(True).scale == 0.0
    assert state.update(True).update(False).scale == 0.0


class CountingSGD(torch.optim.SGD):
    def __init__(self, params):
        super().__init__(params, lr=1.0)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


@pytest.mark.parametrize("name,flags,interval", ALL_PATTERNS, ids=[p[0] for p in ALL_PATTERNS])
def test_gradscaler_end_to_end(name, flags, interval):
    """GradScaler("cpu") driven through scale/step/update: skip decisions, scale bits, and the
    unscaled gradient GradScaler leaves in p.grad, every step. In the collapse pattern the
    scale reaches 0: clean steps then unscale finite gradients to inf/NaN and still step."""
    rng = np.random.default_rng(len(flags) + interval)
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = CountingSGD([param])
    scaler = torch.amp.GradScaler("cpu", growth_interval=interval)
    state = preset("torch", growth_interval=interval).init()
    bad_values = np.array([np.inf, -np.inf, np.nan], np.float32)
    for step, flag in enumerate(flags):
        scaled_loss = scaler.scale(torch.ones((), dtype=torch.float32))
        assert f32_bits(scaled_loss.item()) == f32_bits(scale_loss(np.float32(1.0), state))
        grad = (rng.standard_normal(4) * 10.0 ** rng.integers(-8, 8)).astype(np.float32)
        if flag:
            grad[rng.integers(0, 4)] = bad_values[rng.integers(0, 3)]
        param.grad = torch.from_numpy(grad.copy())
        assert check_overflow(grad, state) == bool(flag)
        expected_grad = unscale(grad, state)
        calls = optimizer.calls
        scaler.step(optimizer)
        scaler.update()
        if not flag:
            assert_same_bits(expected_grad, param.grad.numpy(), f"{name} {step}")
        state = state.update(bool(flag))
        assert (optimizer.calls == calls) == state.skipped, (name, step)
        assert f32_bits(scaler.get_scale()) == f32_bits(state.scale), (name, step)
        assert scaler._get_growth_tracker() == state.growth_tracker, (name, step)


@settings(max_examples=40, deadline=None)
@given(growth=st.floats(1.0 + 2 ** -20, 16.0), backoff=st.floats(2 ** -20, 1 - 2 ** -20),
       interval=st.integers(1, 6),
       init=st.floats(2.0 ** -140, 2.0 ** 120),
       flags=st.lists(st.booleans(), min_size=1, max_size=300))
def test_update_rule_property_any_factors(growth, backoff, interval, init, flags):
    scale_t = torch.full((), init, dtype=torch.float32)
    tracker_t = torch.zeros((), dtype=torch.int32)
    state = preset("torch", init_scale=init, growth_factor=growth, backoff_factor=backoff,
                   growth_interval=interval).init()
    for flag in flags:
        torch._amp_update_scale_(scale_t, tracker_t, torch.tensor(float(flag)), growth,
                                 backoff, interval)
        state = state.update(flag)
        assert f32_bits(state.scale) == f32_bits(scale_t.item())
        assert state.growth_tracker == tracker_t.item()


def test_kernel_counts_any_nonzero_found_inf_as_overflow():
    """Quirk: _amp_update_scale_ tests `if (*found_inf_ptr)`, so NaN or -1 also back off."""
    for value in (float("nan"), -1.0, 2.0):
        scale_t = torch.full((), 4.0)
        tracker_t = torch.full((), 1, dtype=torch.int32)
        torch._amp_update_scale_(scale_t, tracker_t, torch.tensor(value), 2.0, 0.5, 2000)
        assert scale_t.item() == preset("torch", init_scale=4.0).init().update(True).scale
        assert tracker_t.item() == 0


def test_tracker_past_interval_never_grows_like_torch():
    """Quirk: the kernel grows on tracker + 1 == interval; a tracker already past it (after
    set_growth_interval lowered it) counts up for ever until an overflow."""
    scale_t, tracker_t = torch.full((), 8.0), torch.full((), 10, dtype=torch.int32)
    state = preset("torch", init_scale=8.0, growth_interval=3).init()
    state = dataclasses.replace(state, growth_tracker=10)
    for _ in range(20):
        torch._amp_update_scale_(scale_t, tracker_t, torch.zeros(()), 2.0, 0.5, 3)
        state = state.update(False)
    assert scale_t.item() == state.scale == 8.0
    assert tracker_t.item() == state.growth_tracker == 30


def random_f32(rng, n, *, positive=False):
    bits = rng.integers(0, 2 ** 31 if positive else 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    return bits.view(np.float32)


def test_inv_scale_bits_for_random_scales():
    rng = np.random.default_rng(1)
    scales = random_f32(rng, 20_000, positive=True)
    scales = scales[np.isfinite(scales)]
    scales = np.concatenate([scales, np.float32([0.0, 1.0, 2.0 ** -149, 2.0 ** 127, 3.0,
                                                 np.float32(3.4028235e38)])])
    torch_inv = torch.from_numpy(scales).double().reciprocal().float().numpy()
    ours = np.array([ScalerState(scaler=preset("torch"), scale=float(s)).inv_scale
                     for s in scales], np.float32)
    np.testing.assert_array_equal(ours.view(np.uint32), torch_inv.view(np.uint32))


@pytest.mark.parametrize("fmt,dtype", [(None, torch.float32), ("fp16", torch.float16),
                                       ("bf16", torch.bfloat16)])
def test_unscale_bits_and_found_inf_match_the_kernel(fmt, dtype):
    rng = np.random.default_rng(2)
    for trial in range(60):
        scale = float(random_f32(rng, 1, positive=True)[0])
        if not math.isfinite(scale) or scale == 0.0:
            continue
        state = ScalerState(scaler=preset("torch"), scale=scale)
        grads32 = random_f32(rng, 3000)
        if fmt is None:
            grads32 = grads32[np.isfinite(grads32)] if trial % 3 else grads32
            grads_t = torch.from_numpy(grads32.copy())
        else:
            grads_t = torch.from_numpy(grads32.copy()).to(dtype)
            grads32 = grads_t.float().numpy()       # the format's values, held in float32
        inv_t = torch.from_numpy(np.float32([scale])).double().reciprocal().float()[0]
        found_t = torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_([grads_t], found_t, inv_t)
        ours = unscale(grads32, state, fmt)
        assert_same_bits(ours, grads_t.float().numpy())
        assert found_inf(grads32) == bool(found_t.item())
        assert check_overflow(grads32, state) == bool(found_t.item())


def test_found_inf_is_judged_on_scaled_gradients():
    """Quirk: with a scale below 1 a finite scaled gradient can unscale to inf unnoticed; with
    a scale of 0 the unscaled gradients are NaN and the step is not skipped."""
    for scale, grad in ((2.0 ** -10, 3.0e38), (0.0, 0.0)):
        grads_t = torch.tensor([grad], dtype=torch.float32)
        inv_t = torch.tensor(scale, dtype=torch.float32).double().reciprocal().float()
        found_t = torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_([grads_t], found_t, inv_t)
        state = ScalerState(scaler=preset("torch"), scale=scale)
        ours = unscale(np.float32([grad]), state)
        assert found_t.item() == 0.0 and not check_overflow(np.float32([grad]), state)
        assert not np.isfinite(ours[0]) and not np.isfinite(grads_t[0].item())
        assert f32_bits(ours[0]) == f32_bits(grads_t[0].item())


@pytest.mark.parametrize("fmt,dtype", [(None, torch.float32), ("fp16", torch.float16),
                                       ("bf16", torch.bfloat16), (None, torch.float64)])
def test_scale_loss_matches_gradscaler_scale(fmt, dtype):
    rng = np.random.default_rng(3)
    for scale in (2.0 ** 16, 2.0 ** -3, 1000.1, 3.0e38, 2.0 ** -149):
        scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        state = preset("torch", init_scale=scale).init()
        losses = random_f32(rng, 2000)
        losses_t = torch.from_numpy(losses.copy()).to(dtype)
        theirs = scaler.scale(losses_t)
        if dtype == torch.float64:
            ours = scale_loss(losses_t.numpy().copy(), state)
            np.testing.assert_array_equal(ours.view(np.uint64), theirs.numpy().view(np.uint64))
            continue
        ours = scale_loss(losses_t.float().numpy(), state, fmt)
        assert_same_bits(ours, theirs.float().numpy())


def test_sum_check_matches_deepspeed_style_sum_on_order_free_cases():
    cases = [np.float32([1.0, np.inf, -np.inf]), np.float32([np.nan, 1.0]),
             np.full(8, 1e38, np.float32), np.float32([3e38, 3e38]),
             np.float32([3e38, -3e38, 1.0]), np.float32([65504.0] * 1000)]
    for grad in cases:
        with np.errstate(over="ignore"):
            total = float(torch.from_numpy(grad).float().sum())
        theirs = total in (math.inf, -math.inf) or total != total
        assert found_inf(grad, "sum") == theirs
    assert found_inf(np.float32([3e38, 3e38]), "sum") and not found_inf(np.float32([3e38, 3e38]))
