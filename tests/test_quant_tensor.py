"""Per-tensor FP8 scaling (``fpsim.quant.tensor_scaling``) against code nobody here wrote.

- the delayed-scaling update against a line-by-line transcription of Transformer Engine's
  ``kernel_bulk`` (``common/recipe/delayed_scaling.cu``) kept here, in float32 NumPy;
- current scaling's scale and cast against torchao's ``hp_tensor_to_float8_dynamic`` (the
  scale and the FP8 bytes) and against ml_dtypes' float8 casts after TE's saturation;
- the engine's quantized ``linear`` (forward and both gradients) against torchao's
  ``Float8Linear`` on CPU, where the arithmetic of both is exact (power-of-two scales).
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

from fpsim.formats import E4M3FN, E5M2
from fpsim.quant.tensor_scaling import (FLT_MAX, amax, init_delayed, quantize, record_amax,
                                        scale_from_amax, update_delayed)

FORMATS = [E4M3FN, E5M2]


# --- Transformer Engine's kernel_bulk, transcribed (one thread's view of the loops) ----------

def te_kernel_bulk(history, scale, algo, fp8_max, margin):
    """delayed_scaling.cu kernel_bulk for one tensor, amax_reduction_buffer == nullptr."""
    f32 = np.float32
    h = [f32(v) for v in history]
    length = len(h)
    last_amax = h[0]
    amax_value = f32(0)
    if last_amax != f32(0):
        a_values = []
        for i in range(length):
            a = h[i + 1] if i < length - 1 else last_amax
            amax_value = np.fmax(amax_value, a)           # fmaxf: a NaN argument is dropped
            a_values.append(a)
        for i in range(length):
            h[i] = a_values[i] if i > 0 else f32(0)
    if algo == "most_recent":
        amax_value = last_amax
    scaled_max = f32(fp8_max) * f32(2.0) ** f32(-margin)
    with np.errstate(over="ignore", divide="ignore"):
        if np.isfinite(amax_value) and amax_value > 0:
            new_scale = f32(scaled_max / amax_value)
        else:
            new_scale = f32(scale)
    if np.isinf(new_scale):
        new_scale = f32(np.finfo(np.float32).max)
    return [float(v) for v in h], float(new_scale)


AMAX_CASES = [0.0, 1.0, 448.0, 3.0e-39, 1e-30, 2.0 ** -149, 6.5e4, math.inf, math.nan, 0.1,
              FLT_MAX]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 2, 5])
def test_delayed_update_matches_te_kernel_bulk(fmt, algo, length):
    rng = np.random.default_rng(length)
    for margin in (0, 1, 3):
        state = init_delayed(length)
        history, scale = list(state.amax_history), state.scale
        for step in range(60):
            pick = rng.integers(0, len(AMAX_CASES) + 4)
            value = float(np.float32(AMAX_CASES[pick] if pick < len(AMAX_CASES)
                                     else rng.lognormal(0, 6)))      # amaxes are fp32 values
            for _ in range(rng.integers(0, 3)):          # 0, 1 or 2 casts this step
                state = record_amax(state, value)
                history[0] = float(np.fmax(np.float32(history[0]), np.float32(value)))
            state = update_delayed(state, fmt, margin=margin, algorithm=algo)
            history, scale = te_kernel_bulk(history, scale, algo, fmt.max_finite, margin)
            assert list(state.amax_history) == pytest.approx(history, nan_ok=True, abs=0, rel=0)
            assert state.scale == scale, (step, value, state, history, scale)



@pytest.mark.parametrize("length,kind", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                         (True, TypeError), ("4", TypeError)])
def test_a_history_length_that_is_not_a_positive_integer_is_refused(length, kind):
    with pytest.raises(kind, match=f"^amax history length must be a positive integer, got "
                                   f"{re.escape(repr(length))}$"):
        init_delayed(length)
    assert init_delayed(np.int64(2)).amax_history == (0.0, 0.0)

def test_delayed_edge_cases_by_hand():
    state = update_delayed(init_delayed(3), E4M3FN)          # nothing recorded: no roll
    assert state == init_delayed(3)
    state = update_delayed(record_amax(init_delayed(3), math.inf), E4M3FN)
    assert state.scale == 1.0 and state.amax_history == (0.0, 0.0, math.inf)
    state = update_delayed(record_amax(state, 2.0), E4M3FN)  # inf still in the window
    assert state.scale == 1.0
    state = update_delayed(record_amax(state, 2.0), E4M3FN)
    state = update_delayed(record_amax(state, 2.0), E4M3FN)  # inf has left it
    assert state.scale == 224.0
    tiny = update_delayed(record_amax(init_delayed(1), 2.0 ** -149), E4M3FN)
    assert tiny.scale == FLT_MAX                             # 448 / 2^-149 overflows fp32
    assert record_amax(init_delayed(2), math.nan).amax_history == (0.0, 0.0)


def test_current_scale_rules():
    assert scale_from_amax(0.0, E4M3FN) == 1.0
    assert scale_from_amax(math.inf, E4M3FN) == 1.0
    assert scale_from_amax(math.nan, E4M3FN) == 1.0
    assert scale_from_amax(2.0 ** -149, E4M3FN) == FLT_MAX
    assert scale_from_amax(3.0, E4M3FN) == float(np.float32(448) / np.float32(3))
    assert scale_from_amax(3.0, E4M3FN, power_2=True) == 128.0
    assert scale_from_amax(1e-9, E4M3FN, epsilon=1e-3) == float(np.float32(448) / np.float32(1e-3))
    assert amax(np.array([1.0, -np.nan, -3.0], np.float32)) == 3.0      # fmaxf drops NaN
    assert amax(np.array([np.nan], np.float32)) == 0.0
    assert amax(np.array([1.0, -np.inf], np.float32)) == math.inf


def _hard_values(rng, fmt, n=4096):
    """Random magnitudes over the format's range, their rounding midpoints and specials."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    grid = np.array([fmt.max_finite, fmt.smallest_subnormal, fmt.min_normal, 1.0], np.float32)
    half_ulp = np.float32(1 + 2.0 ** -(fmt.man_bits + 1))             # midpoints above 1.0
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e38, -1e38], np.float32)
    return np.concatenate([x, grid, grid * half_ulp, -grid * half_ulp, grid * np.float32(0.5),
                           specials])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_quantize_is_ml_dtypes_cast_after_saturation(fmt):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is the float8 cast oracle")
    target = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt.name]
    rng = np.random.default_rng(7)
    x = _hard_values(rng, fmt)
    for scale in (1.0, 0.3, 37.25, 2.0 ** 20):
        q = quantize(x, scale, fmt)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = x * np.float32(scale)
        clamped = np.clip(scaled, -fmt.max_finite, fmt.max_finite)   # NaN stays NaN
        expect = clamped.astype(target).astype(np.float32)
        np.testing.assert_array_equal(q.values, expect)
        with np.errstate(invalid="ignore", over="ignore"):   # the unsaturated cast overflows:
            unsaturated = scaled.astype(target).astype(np.float32)      # what saturation changed
        assert q.saturated == int(np.sum(~np.isfinite(unsaturated) & ~np.isnan(scaled)))
        assert q.scale_inv == float(np.float32(1) / np.float32(scale))


def _torchao():
    pytest.importorskip("torch", reason="torchao needs PyTorch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("torchao.float8", reason="torchao is the FP8 training oracle")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("power_2", [False, True])
def test_current_scaling_matches_torchao(fmt, power_2):
    _torchao()
    import torch
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt.name]
    rng = np.random.default_rng(3)
    for trial in range(40):
        x = (rng.standard_normal(512) * np.exp2(rng.integers(-20, 20))).astype(np.float32)
        x[:8] = x[:8] * np.float32(2.0 ** rng.integers(-30, 10))       # outliers, tinies
        ours_scale = scale_from_amax(amax(x), fmt, power_2=power_2)
        theirs = hp_tensor_to_float8_dynamic(torch.from_numpy(x), dtype, LinearMMConfig(),
                                             round_scales_to_power_of_2=power_2)
        assert ours_scale == float(theirs._scale), trial
        q = quantize(x, ours_scale, fmt)
        np.testing.assert_array_equal(q.values, theirs._data.float().numpy())


def _float8_linear_pair(rng, in_features, out_features):
    import torch
    from fpsim import nn
    weight = (rng.standard_normal((out_features, in_features)) / 4).astype(np.float32)
    ours = nn.Linear(in_features, out_features, bias=False, rng=0)
    ours.weight.data[...] = weight
    theirs = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(weight))
    return ours, theirs


def test_quantized_linear_matches_torchao_float8_linear():
    """Forward, input gradient and weight gradient, bit for bit: power-of-two scales make
    both dequantizations exact and K = 8 small-integer-like sums are exact in fp32, so the
    two implementations' different GEMM arithmetic cannot show."""
    ao = _torchao()
    import torch
    from fpsim.autograd import Policy, Tensor, use_policy
    policy = Policy(matmul="fp32", fp8="fp8-current:power2=1", name="fp8-fp32")
    rng = np.random.default_rng(11)
    for trial in range(10):
        ours, theirs = _float8_linear_pair(rng, 8, 6)
        config = ao.Float8LinearConfig(emulate=True, round_scales_to_power_of_2=True)
        model = torch.nn.Sequential(theirs)
        ao.convert_to_float8_training(model, config=config)
        x = (rng.standard_normal((5, 8)) * 2).astype(np.float32)
        g = (rng.standard_normal((5, 6)) * 2.0 ** -10).astype(np.float32)
        tx = torch.from_numpy(x.copy()).requires_grad_(True)
        ty = model(tx)
        ty.backward(torch.from_numpy(g))
        with use_policy(policy):
            xt = Tensor(x, requires_grad=True)
            y = ours(xt)
            y.backward(g)
        np.testing.assert_array_equal(y.data, ty.detach().numpy(), err_msg=f"trial {trial}")
        np.testing.assert_array_equal(xt.grad.data, tx.grad.numpy())
        np.testing.assert_array_equal(ours.weight.grad.data, model[0].weight.grad.numpy())


def test_torchao_rule_differs_from_te_on_three_documented_classes():
    """The module docstring's three classes, pinned: a power-of-two scale just below 2**k, an
    infinite amax, an amax below torchao's 1e-12 floor (0 included)."""
    # 448/amax: 2 ulps below 128
    just_above_3_5 = float(np.nextafter(np.float32(3.5), np.float32(4)))
    assert scale_from_amax(just_above_3_5, E4M3FN, power_2=True) == 64.0
    assert scale_from_amax(just_above_3_5, E4M3FN, power_2=True, rule="torchao") == 128.0
    assert scale_from_amax(math.inf, E4M3FN) == 1.0
    assert scale_from_amax(math.inf, E4M3FN, rule="torchao") == 0.0
    q = quantize(np.array([math.inf, 2.0], np.float32), 0.0, E4M3FN)
    assert math.isnan(q.values[0]) and q.values[1] == 0.0 and q.scale_inv == math.inf
    assert scale_from_amax(0.0, E4M3FN) == 1.0
    assert scale_from_amax(0.0, E4M3FN, rule="torchao") == float(np.float32(448e12))
    assert scale_from_amax(1e-13, E4M3FN) == float(np.float32(448 / np.float64(np.float32(1e-13))))
    assert scale_from_amax(1e-13, E4M3FN, rule="torchao") == float(np.float32(448e12))
    assert math.isnan(scale_from_amax(math.nan, E4M3FN, rule="torchao"))
    # elsewhere the two agree
    assert scale_from_amax(3.0, E5M2, rule="torchao") == scale_from_amax(3.0, E5M2)
    with pytest.raises(ValueError, match="epsilon is Transformer Engine's"):
        scale_from_amax(1.0, E4M3FN, epsilon=1e-6, rule="torchao")
    with pytest.raises(ValueError, match="unknown current-scaling rule 'ao'; accepted"):
        scale_from_amax(1.0, E4M3FN, rule="ao")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_torchao_rule_matches_amax_to_scale_at_every_power_of_two(fmt):
    """amaxes a few float32 ulps either side of max/2**k, and the special amaxes, through
    torchao's own amax_to_scale: rule='torchao' is it bit for bit, power_2 included."""
    _torchao()
    import torch
    from torchao.float8.float8_utils import amax_to_scale
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt.name]
    centres = np.float32(fmt.max_finite) / np.exp2(np.arange(-20, 40)).astype(np.float32)
    bits = centres.view(np.int32)[:, None] + np.arange(-6, 7, dtype=np.int32)
    amaxes = np.concatenate([bits.view(np.float32).ravel(),
                             np.float32([0, 1e-13, 2.0 ** -149, np.inf, np.nan])])
    twice_te = 0
    for value in amaxes:
        for power_2 in (False, True):
            theirs = float(amax_to_scale(torch.tensor(value), dtype, power_2))
            ours = scale_from_amax(float(value), fmt, power_2=power_2, rule="torchao")
            assert ours == theirs or (math.isnan(ours) and math.isnan(theirs)), (value, power_2)
            twice_te += power_2 and theirs == 2 * scale_from_amax(float(value), fmt, power_2=True)
    assert twice_te > 0
