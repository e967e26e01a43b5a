"""fpsim.scaling: hand-worked trajectories per preset (expected values read off each source),
the protocol, static/none scalers, bad input, and the loss/gradient numerics."""
import dataclasses
import math

import numpy as np
import pytest

import fpsim.scaling as scaling
from fpsim import backend
from fpsim.scaling import (Decision, DynamicScaler, LossScaleMinimumError, NoScaler,
                           ScalerState, StaticScaler, check_overflow, found_inf, preset,
                           scale_loss, trajectory, unscale)

T, F = True, False
S, K, M = 2.0 ** 16, 2.0 ** 15, 2.0 ** 32


def on(x):
    """Host data as a backend array of the same dtype (what the engine hands the scalers)."""
    x = np.asarray(x)
    return backend.asarray(x, getattr(backend.xp, x.dtype.name))


def scales(name_or_scaler, flags, **overrides):
    scaler = (preset(name_or_scaler, **overrides) if isinstance(name_or_scaler, str)
              else name_or_scaler)
    return [s.scale for s in trajectory(scaler, flags)[1:]]


def test_torch_by_hand():
    flags = [F, F, F, T, F, F, T, F, F, F]
    states = trajectory(preset("torch", growth_interval=3), flags)[1:]
    assert [s.scale for s in states] == [S, S, 2 * S, S, S, S, S / 2, S / 2, S / 2, S]
    assert [s.growth_tracker for s in states] == [1, 2, 0, 0, 1, 2, 0, 1, 2, 0]


def test_deepspeed_by_hand():
    """First growth after window + 1 clean steps, then every window; hysteresis 2 absorbs
    the first overflow and is refilled only by a growth; any overflow restarts the count."""
    flags = [F, F, F, F, F, F, F, T, F, T, T, F, F, F, F]
    states = trajectory(preset("deepspeed", growth_interval=3), flags)[1:]
    assert [s.scale for s in states] == [S, S, S, 2 * S, 2 * S, 2 * S, 4 * S, 4 * S, 4 * S,
                                         2 * S, S, S, S, S, 2 * S]
    assert [s.hysteresis_left for s in states] == [2] * 7 + [1] * 7 + [2]
    assert states[7].decision.hysteresis_absorbed and states[7].skipped
    assert states[7].decision.action == "hysteresis"


def test_deepspeed_raises_at_minimum():
    state = preset("deepspeed", init_scale=2.0, hysteresis=1).init().update(T)
    assert state.scale == 1.0
    with pytest.raises(LossScaleMinimumError, match="minimum") as info:
        state.update(T)
    assert info.value.state is state and info.value.step == 1
    assert isinstance(info.value, RuntimeError)
    assert preset("deepspeed", init_scale=2.0, hysteresis=1, raise_at_min=False).init() \
        .update(T).update(T).scale == 1.0


def test_deepspeed_consecutive_hysteresis_refills_on_clean_steps():
    flags = [T, F, T, F, T]
    assert scales("deepspeed", flags, hysteresis_refill="clean") == [S] * 5
    assert scales("deepspeed", flags) == [S, S, S / 2, S / 2, S / 4]


def test_megatron_by_hand():
    """Hysteresis tracker goes 1, 0, -1: after the first backoff every overflow backs off
    until a growth refills it."""
    flags = [T, T, T, F, F, F, T, F, F, F, T]
    states = trajectory(preset("megatron", growth_interval=3), flags)[1:]
    assert [s.scale for s in states] == [M, M / 2, M / 4, M / 4, M / 4, M / 2, M / 2, M / 2,
                                         M / 2, M, M]
    assert [s.hysteresis_left for s in states] == [1, 0, -1, -1, -1, 2, 1, 1, 1, 2, 1]


def test_apex_by_hand():
    assert scales("apex", [F, F, F, F], growth_interval=2, init_scale=2.0 ** 23) == \
        [2.0 ** 23, 2.0 ** 24, 2.0 ** 24, 2.0 ** 24]
    blocked = trajectory(preset("apex", growth_interval=2, init_scale=2.0 ** 24), [F, F])[-1]
    assert blocked.decision.growth_blocked == "max_scale" and not blocked.decision.grew
    assert scales("apex", [T, T, T], min_scale=2.0 ** 15) == [2.0 ** 15] * 3
    # apex quirk: an initial scale above the ceiling is pulled down to it by a "growth"
    assert scales("apex", [F, F], growth_interval=2, init_scale=2.0 ** 26) == \
        [2.0 ** 26, 2.0 ** 24]


def test_tf_keras_by_hand():
    assert scales("tf-keras", [F, F, F, T, F], growth_interval=3) == [K, K, 2 * K, K, K]
    lifted = preset("tf-keras", init_scale=0.5).init().update(T)
    assert lifted.scale == 1.0 and lifted.decision.floored   # tf.maximum(s / 2, 1) lifts it
    # ">=": a tracker past the interval grows at the next clean step (torch never would)
    late = dataclasses.replace(preset("tf-keras", growth_interval=3).init(), growth_tracker=10)
    assert late.update(F).scale == 2 * K
    late_torch = dataclasses.replace(preset("torch", growth_interval=3).init(),
                                     growth_tracker=10)
    assert late_torch.update(F).scale == S and late_torch.update(F).growth_tracker == 11


def test_keras3_and_jmp_by_hand():
    assert scales("keras3", [F, F, T, F], growth_interval=2) == [K, 2 * K, K, K]
    assert scales("jmp", [F, F, T, F, F], growth_interval=2) == [K, 2 * K, K, K, 2 * K]
    wrapped = dataclasses.replace(preset("jmp", growth_interval=3).init(), growth_tracker=5)
    after = wrapped.update(F)                                # (5 + 1) % 3 == 0, no growth
    assert after.scale == K and after.growth_tracker == 0


def test_float32_ftz_models_xla_cpu_flushing_the_collapsing_scale():
    """Keras 3 on jax (and jmp, eager with a low minimum) halve 2**-126 to 0, not 2**-127:
    XLA on CPU flushes subnormal results. float32_ftz does; float32 walks the subnormals."""
    flags = [T] * 8
    xla = scales("keras3", flags, init_scale=2.0 ** -120, precision="float32_ftz")
    plain = scales("keras3", flags, init_scale=2.0 ** -120)
    assert xla[5] == plain[5] == 2.0 ** -126
    assert xla[6:] == [0.0, 0.0] and plain[6:] == [2.0 ** -127, 2.0 ** -128]
    jmp = scales("jmp", flags, init_scale=2.0 ** -120, min_scale=2.0 ** -125,
                 precision="float32_ftz")
    assert jmp[-1] == 2.0 ** -125                       # a normal minimum: nothing to flush
    with pytest.raises(ValueError, match="min_scale must be > 0 and finite in float32_ftz"):
        preset("jmp", min_scale=2.0 ** -130, precision="float32_ftz")
    assert scales("keras3", [F, T, F], growth_interval=2, precision="float32_ftz") == \
        scales("keras3", [F, T, F], growth_interval=2)


def test_float32_arithmetic_per_precision():
    """1000.1 is rounded to float32 by float32 scalers; a 1.3 factor is applied in float64 then
    rounded (torch) or as float32 times float32 (Megatron): 1300.1300048828125 vs
    1300.1298828125."""
    f32 = float(np.float32(1000.1))
    torch_like = DynamicScaler(init_scale=1000.1, growth_factor=1.3, growth_interval=1)
    fp32 = dataclasses.replace(torch_like, precision="float32")
    fp64 = dataclasses.replace(torch_like, precision="float64")
    assert torch_like.init().scale == fp32.init().scale == f32
    assert fp64.init().scale == 1000.1
    assert torch_like.init().update(F).scale == float(np.float32(f32 * 1.3)) == 1300.1300048828125
    assert fp32.init().update(F).scale == float(np.float32(f32) * np.float32(1.3))
    assert fp64.init().update(F).scale == 1000.1 * 1.3
    assert torch_like.init().update(F).scale != fp32.init().update(F).scale


def test_state_is_immutable_and_update_is_pure():
    state = preset("torch").init()
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.scale = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset("torch").growth_interval = 3
    nxt = state.update(T)
    assert state.scale == S and state.step == 0 and nxt.step == 1
    assert state.decision is None and not state.skipped


def test_counters_explain_history():
    flags = [T, T, F, T, T, T]
    state = trajectory(preset("torch", growth_interval=1), flags)[-1]
    assert (state.total_skips, state.consecutive_skips, state.total_overflows) == (5, 3, 5)
    assert (state.growths, state.backoffs, state.last_overflow_step, state.step) == (1, 5, 5, 6)
    assert "backoff" in state.decision.reason and "skipped" in str(state.decision)
    grow = trajectory(preset("torch", growth_interval=1), [F])[-1].decision
    assert grow.action == "grow" and "growth due" in grow.reason
    assert isinstance(grow, Decision) and "ScalerState(torch" in repr(state)


def test_static_and_none_share_the_protocol():
    state = trajectory(StaticScaler(1000.1), [T, T, F, T])[-1]
    assert state.scale == float(np.float32(1000.1)) and state.total_skips == 3
    assert state.consecutive_skips == 1 and state.decision.action == "hold"
    assert StaticScaler(1000.1, precision="float64").init().scale == 1000.1
    assert not StaticScaler(8.0, skip_on_overflow=False).init().update(T).skipped
    none = trajectory(NoScaler(), [T, F])
    assert [s.scale for s in none] == [1.0] * 3 and none[-1].total_overflows == 1
    assert none[1].total_skips == 0 and NoScaler(skip_on_overflow=True).init().update(T).skipped
    assert backend.to_list(unscale(on(np.float32([3.0])), none[1])) == [3.0]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, 1e39, 1e-50])
def test_bad_scales_are_value_errors(bad):
    with pytest.raises(ValueError):
        DynamicScaler(init_scale=bad)
    with pytest.raises(ValueError):
        StaticScaler(bad)
    with pytest.raises(ValueError):
        preset("megatron", min_scale=bad)


@pytest.mark.parametrize("field,value", [
    ("growth_factor", 1.0), ("growth_factor", 0.5), ("growth_factor", math.nan),
    ("growth_factor", -2.0), ("backoff_factor", 0.0), ("backoff_factor", 1.0),
    ("backoff_factor", -0.5), ("backoff_factor", math.nan), ("growth_interval", 0),
    ("hysteresis", 0), ("precision", "float16"), ("backoff_op", "subtract"),
    ("growth_compare", ">"), ("overflow_check", "max"), ("tracker_start", 5)])
def test_bad_parameters_are_value_errors(field, value):
    with pytest.raises(ValueError, match=field):
        DynamicScaler(**{field: value, "growth_interval": 5} if field != "growth_interval"
                      else {field: value})


def test_divide_backoff_needs_a_divisor_and_bad_types():
    with pytest.raises(ValueError, match="backoff_factor must be > 1"):
        preset("apex", backoff_factor=0.5)
    with pytest.raises(ValueError, match="min_scale"):
        DynamicScaler(min_scale=8.0, max_scale=4.0)
    with pytest.raises(ValueError, match="raise_at_min"):
        DynamicScaler(raise_at_min=True)
    with pytest.raises(TypeError):
        DynamicScaler(growth_interval=2.5)
    with pytest.raises(TypeError):
        DynamicScaler(init_scale="65536")
    with pytest.raises(TypeError):
        DynamicScaler(finite_guard="yes")
    with pytest.raises(TypeError, match="found_inf must be a bool"):
        preset("torch").init().update(1.0)
    assert preset("torch").init().update(np.bool_(True)).skipped
    assert preset("torch").init().update(np.array(True)).skipped


def test_preset_errors_list_what_is_valid():
    with pytest.raises(ValueError, match="torch, apex, deepspeed, deepspeed-fp16, megatron, "
                                         "tf-keras, keras3"):
        preset("pytorch-lightning")
    with pytest.raises(ValueError, match="valid keys: init_scale, growth_factor"):
        preset("torch", growth_intervall=3)
    assert preset("TF_KERAS") == preset("tf-keras")
    with pytest.raises(TypeError):
        preset(3)


def test_every_preset_cites_its_source():
    for name, builder in scaling.PRESETS.items():
        doc = builder.__doc__
        assert "Source" in doc and ".py" in doc, name
        scaler = preset(name)
        assert scaler.name == name and scaler.source and scaler.source.split()[0] in doc


def test_scale_loss_rounds_once_to_the_format():
    state = preset("torch").init()
    out = scale_loss(backend.asarray(np.float32([0.5, 2.0, 1.0]), backend.xp.float32), state,
                     "fp16")
    assert backend.to_list(out) == [32768.0, math.inf, math.inf]  # opmath float32, then float16
    assert backend.to_numpy(scale_loss(on(np.float32(3.0)), state)) == np.float32(196608.0)
    assert scale_loss(1.5, preset("deepspeed", init_scale=1000.1).init()) == 1.5 * 1000.1
    with pytest.raises(TypeError, match="float32 or float64"):
        scale_loss(on(np.array([1, 2], np.int64)), state)


def test_unscale_keeps_structure_and_inputs():
    state = preset("torch").init()
    xp = backend.xp
    grads = [backend.asarray(np.float32([S, 3 * S]), xp.float32),
             backend.asarray(np.float64([S]), xp.float64)]
    out = unscale(tuple(grads), state)
    assert (isinstance(out, tuple) and backend.to_list(out[0]) == [1.0, 3.0]
            and out[1].dtype == xp.float64)
    assert backend.to_list(grads[0]) == [S, 3 * S]
    assert isinstance(unscale(list(grads), state), list)
    big = backend.asarray(np.float32([S, 70000.0 * S]), xp.float32)
    assert backend.to_list(unscale(big, state, "fp16")) == [1.0, math.inf]


def test_keras3_divides_where_others_multiply_by_the_reciprocal():
    state = ScalerState(scaler=preset("keras3"), scale=3.0)
    grads = np.float32([1.0, 7.0, 10.0])
    on_backend = backend.asarray(grads, backend.xp.float32)
    divided = backend.to_numpy(unscale(on_backend, state))
    by_reciprocal = backend.to_numpy(unscale(on_backend,
                                             ScalerState(scaler=preset("torch"), scale=3.0)))
    np.testing.assert_array_equal(divided, grads / np.float32(3.0))
    assert not np.array_equal(divided, by_reciprocal)       # 7/3 != 7 * float32(1/3)


def test_reciprocal_via_float64_equals_float32_division():
    rng = np.random.default_rng(0)
    bits = rng.integers(1, 0x7F800000, 200_000, dtype=np.int64).astype(np.uint32)
    scales_ = bits.view(np.float32)
    with np.errstate(over="ignore"):
        via64 = (1.0 / scales_.astype(np.float64)).astype(np.float32)
        direct = np.float32(1.0) / scales_
    np.testing.assert_array_equal(via64.view(np.uint32), direct.view(np.uint32))
    assert ScalerState(scaler=NoScaler(), scale=0.0).inv_scale == math.inf


def test_found_inf_methods_and_check_overflow():
    assert not found_inf([on(np.float32([1.0, 2.0])), on(np.float64([3.0]))])
    assert found_inf(on(np.float32([1.0, np.nan])))
    assert found_inf((on(np.float32([1.0])), on(np.float32([-np.inf]))))
    big = on(np.float32([3e38, 3e38]))
    assert not found_inf(big) and found_inf(big, "sum")
    # DeepSpeed 0.19.6 tests amax/amin (any inf or NaN); up to 0.19.5 its sum overflowed here
    assert not check_overflow(big, preset("deepspeed").init())
    assert not check_overflow(big, preset("deepspeed-fp16").init())
    assert check_overflow(big, preset("deepspeed", overflow_check="sum").init())
    assert not check_overflow(big, preset("torch").init())
    assert found_inf(on(np.float32([np.inf, -np.inf])), "sum")
    with pytest.raises(ValueError, match="nonfinite"):
        found_inf(big, "any")
    tf_state = preset("tf-keras").init()
    assert check_overflow([on(np.float32([1.0])), on(np.float32([np.inf]))], tf_state)
    assert not check_overflow(on(np.float32([65504.0 * K])), tf_state, "fp16")
