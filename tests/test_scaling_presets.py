"""Each preset against a literal transcription of its framework's update code, and properties.

The transcriptions below keep each framework's own variables and control flow (DeepSpeed's
iteration arithmetic, Megatron's hysteresis tracker, jmp's modulo counter...) with NumPy
float32 standing in for float32 tensors, so they check that the general DynamicScaler's
parameters really reproduce those different formulations. torch itself is checked against
the real library in test_scaling_torch.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim.scaling import LossScaleMinimumError, preset, preset_names

F32 = np.float32


class ApexRef:                     # apex/amp/scaler.py LossScaler.update_scale
    def __init__(self, window, min_scale=None, max_scale=2.0 ** 24):
        self.scale, self.window, self.unskipped = 2.0 ** 16, window, 0
        self.min, self.max = min_scale, max_scale

    def update(self, overflow):
        if overflow:
            skip = True
            self.scale = max(self.min, self.scale / 2.0) if self.min else self.scale / 2.0
            self.unskipped = 0
        else:
            skip = False
            self.unskipped += 1
        if self.unskipped == self.window:
            self.scale = min(self.max, self.scale * 2.0)
            self.unskipped = 0
        return skip


class AtMinimum(Exception):
    """DeepSpeed raises a bare Exception; the transcription names it to catch only it."""


class DeepSpeedRef:                # deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler
    def __init__(self, window, hysteresis=2, consecutive=False, min_scale=1):
        self.scale, self.window, self.min = 2 ** 16, window, min_scale
        self.cur_iter, self.last_overflow_iter = 0, -1
        self.delayed_shift = self.cur_hysteresis = hysteresis
        self.consecutive = consecutive

    def update(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.scale == self.min:
                    raise AtMinimum("Current loss scale already at minimum")
                self.scale = max(self.scale / 2.0, self.min)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive:
                self.cur_hysteresis = self.delayed_shift
            stable = (self.cur_iter - self.last_overflow_iter) - 1
            if stable > 0 and stable % self.window == 0:
                if not self.consecutive:
                    self.cur_hysteresis = self.delayed_shift
                self.scale *= 2.0
        self.cur_iter += 1
        return overflow


class DeepSpeedFP16Ref:            # deepspeed/runtime/fp16/fused_optimizer.py (0.19.6)
    """FP16_Optimizer._update_scale (FP16_UnfusedOptimizer's is the same): no hysteresis,
    the floor clamps instead of raising."""

    def __init__(self, window, min_loss_scale=1):
        self.cur_scale, self.scale_window, self.min_loss_scale = 2 ** 16, window, min_loss_scale
        self.cur_iter, self.last_overflow_iter, self.scale_factor = 0, -1, 2.0

    @property
    def scale(self):
        return self.cur_scale

    def update(self, skip):
        if skip:
            self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_loss_scale)
            self.last_overflow_iter = self.cur_iter
        else:
            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
        return skip


class MegatronRef:                 # megatron/core/optimizer/grad_scaler.py DynamicGradScaler
    def __init__(self, interval, hysteresis=2, init=2.0 ** 32):
        self.scale, self.min = F32(init), F32(1.0)
        self.growth, self.backoff = F32(2.0), F32(0.5)
        self.interval, self.hysteresis = interval, hysteresis
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis

    def update(self, found_inf):
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = np.maximum(self.scale * self.backoff, self.min)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * self.growth
        return found_inf


class TfKerasRef:                  # tf_keras/.../loss_scale_optimizer.py _DynamicLossScaleState
    def __init__(self, growth_steps, init=2.0 ** 15):
        self.scale, self.counter, self.growth_steps = F32(init), 0, growth_steps

    def update(self, is_finite):
        if is_finite:
            if self.counter + 1 >= self.growth_steps:
                new = self.scale * F32(2.0)
                if np.isfinite(new):
                    self.scale = new
                self.counter = 0
            else:
                self.counter += 1
        else:
            self.counter = 0
            self.scale = np.maximum(self.scale / F32(2.0), F32(1))
        return not is_finite


class Keras3Ref:                   # keras/src/optimizers/loss_scale_optimizer.py
    def __init__(self, growth_steps, init=2.0 ** 15):
        self.scale, self.counter, self.growth_steps = F32(init), 0, growth_steps

    def update(self, finite):
        if finite:
            if self.counter == self.growth_steps - 1:
                self.counter, self.scale = 0, self.scale * F32(2.0)
            else:
                self.counter += 1
        else:
            self.counter, self.scale = 0, self.scale / F32(2.0)
        return not finite


class JmpRef:                      # jmp/_src/loss_scale.py DynamicLossScale.adjust
    def __init__(self, period, init=2.0 ** 15):
        self.loss_scale, self.counter, self.period = F32(init), np.int32(0), period
        self.factor, self.min_loss_scale = 2, F32(1)

    def update(self, grads_finite):
        if grads_finite:
            if self.counter == self.period - 1:
                grown = self.loss_scale * F32(self.factor)
                self.loss_scale = grown if np.isfinite(grown) else self.loss_scale
        else:
            self.loss_scale = np.maximum(self.min_loss_scale, self.loss_scale / F32(self.factor))
        self.counter = np.int32(((self.counter + 1) % self.period) * grads_finite)
        return not grads_finite


def reference(name, interval):
    return {"apex": lambda: ApexRef(interval), "deepspeed": lambda: DeepSpeedRef(interval),
            "deepspeed-fp16": lambda: DeepSpeedFP16Ref(interval),
            "megatron": lambda: MegatronRef(interval), "tf-keras": lambda: TfKerasRef(interval),
            "keras3": lambda: Keras3Ref(interval), "jmp": lambda: JmpRef(interval)}[name]()


def ref_scale(ref):
    value = ref.loss_scale if isinstance(ref, JmpRef) else ref.scale
    return float(value)


def ref_update(ref, overflow):
    """The reference's skip decision; tf-keras, Keras 3 and jmp are told "finite"."""
    with np.errstate(over="ignore", under="ignore"):       # float32 scales may reach 0/inf
        if isinstance(ref, (TfKerasRef, Keras3Ref, JmpRef)):
            return ref.update(not overflow)
        return ref.update(overflow)


def run_both(name, flags, interval):
    """Step the preset and the transcription together; compare every step. Returns the number
    of steps done (DeepSpeed stops with its error at the minimum)."""
    ref = reference(name, interval)
    state = preset(name, growth_interval=interval).init()
    assert state.scale == ref_scale(ref)
    for step, flag in enumerate(flags):
        try:
            skipped = ref_update(ref, bool(flag))
        except AtMinimum:                           # DeepSpeed at its minimum
            with pytest.raises(LossScaleMinimumError):
                state.update(bool(flag))
            return step
        state = state.update(bool(flag))
        assert state.skipped == skipped, (name, step)
        scale, expected = state.scale, ref_scale(ref)
        assert scale == expected or (math.isnan(scale) and math.isnan(expected)), (name, step)
        assert math.copysign(1, scale) == math.copysign(1, expected)
        if isinstance(ref, MegatronRef):
            assert (state.growth_tracker, state.hysteresis_left) == (
                ref.growth_tracker, ref.hysteresis_tracker)
        if isinstance(ref, DeepSpeedRef):
            assert state.hysteresis_left == ref.cur_hysteresis
            assert state.last_overflow_step == ref.last_overflow_iter
        if isinstance(ref, (TfKerasRef, Keras3Ref, ApexRef)):
            counter = ref.unskipped if isinstance(ref, ApexRef) else ref.counter
            assert state.growth_tracker == counter, (name, step)
        if isinstance(ref, JmpRef):
            assert state.growth_tracker == int(ref.counter)
    return len(flags)


NON_TORCH = [n for n in preset_names() if n != "torch"]


def overflow_patterns():
    rng = np.random.default_rng(7)
    out = [("random 1%", rng.random(3000) < 0.01, 10), ("random 30%", rng.random(3000) < 0.3, 2),
           ("random 80%", rng.random(2000) < 0.8, 1), ("long clean", np.zeros(3000, bool), 1),
           ("always overflow", np.ones(1200, bool), 4),
           ("pairs of overflows", np.tile([False] * 6 + [True, True], 300), 3)]
    bursts = np.zeros(4000, bool)
    for start in rng.integers(0, 3950, 30):
        bursts[start:start + rng.integers(1, 12)] = True
    out.append(("bursts", bursts, 17))
    return out


@pytest.mark.parametrize("name", NON_TORCH)
@pytest.mark.parametrize("pattern,flags,interval", overflow_patterns(),
                         ids=[p[0] for p in overflow_patterns()])
def test_preset_matches_transcription(name, pattern, flags, interval):
    run_both(name, flags, interval)


def run_preset(name, flags, **overrides):
    state = preset(name, **overrides).init()
    for flag in flags:
        state = state.update(bool(flag))
    return state


def test_unguarded_scales_reach_their_ends_and_stay():
    """Keras 3 has no floor: 2**15 halves to 0 after 165 overflows and 0 never grows back.
    Megatron and Keras 3 have no finite guard: growth reaches float32 inf and stays there.
    torch, tf-keras and jmp stop at 2**127; DeepSpeed raises after reaching its floor."""
    assert run_preset("keras3", [True] * 164).scale == 2.0 ** -149
    assert run_preset("keras3", [True] * 165 + [False] * 50, growth_interval=2).scale == 0.0
    assert run_preset("megatron", [True] * 1200).scale == 1.0
    assert run_preset("megatron", [False] * 95, growth_interval=1).scale == 2.0 ** 127
    assert run_preset("megatron", [False] * 96 + [True] * 9, growth_interval=1).scale == math.inf
    assert run_preset("keras3", [False] * 113 + [True] * 3, growth_interval=1).scale == math.inf
    for name in ("torch", "tf-keras", "jmp"):
        assert run_preset(name, [False] * 300, growth_interval=1).scale == 2.0 ** 127
    assert run_preset("apex", [False] * 300, growth_interval=1).scale == 2.0 ** 24
    assert run_preset("tf-keras", [True] * 300).scale == run_preset("jmp", [True] * 300).scale == 1
    assert run_both("deepspeed", np.ones(40, bool), 4) == 17


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NON_TORCH), interval=st.integers(1, 6),
       flags=st.lists(st.booleans(), max_size=400))
def test_preset_matches_transcription_property(name, interval, flags):
    run_both(name, flags, interval)


def trailing_run(flags):
    count = 0
    for flag in reversed(flags):
        if not flag:
            break
        count += 1
    return count


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(preset_names()), interval=st.integers(1, 5),
       flags=st.lists(st.booleans(), max_size=300))
def test_properties_of_factor_two_presets(name, interval, flags):
    scaler = preset(name, growth_interval=interval)
    state = scaler.init()
    init = state.scale
    for step, flag in enumerate(flags):
        try:
            new = state.update(flag)
        except LossScaleMinimumError:
            assert name == "deepspeed" and flag and state.scale == 1.0
            return
        decision = new.decision
        assert decision.skipped == flag                      # skip iff found_inf
        assert decision.step == step and new.step == step + 1
        assert decision.scale_before == state.scale and decision.scale_after == new.scale
        assert sum((decision.grew, decision.backed_off, decision.hysteresis_absorbed)) <= 1
        if new.scale not in (0.0, math.inf):                  # a power of two times init
            mantissa, _ = math.frexp(new.scale / init)
            assert mantissa == 0.5
        if scaler.min_scale is not None:
            assert new.scale >= scaler.min_scale
        if scaler.max_scale is not None:
            assert new.scale <= scaler.max_scale
        if flag:
            assert new.scale <= state.scale and new.growth_tracker == scaler.tracker_start
        else:
            assert new.scale >= state.scale
        assert scaler.tracker_start <= new.growth_tracker < interval
        assert new.hysteresis_left <= scaler.hysteresis
        state = new
    assert state.total_skips == state.total_overflows == sum(flags)
    assert state.consecutive_skips == trailing_run(flags)
    assert state.growths + state.backoffs <= len(flags)
    assert state.backoffs <= sum(flags)
    assert state.last_overflow_step == (max(i for i, f in enumerate(flags) if f)
                                        if any(flags) else -1)
