"""Closed sets of strings as string-valued enums: a member is its string (equal, same hash,
written to JSON as it), so the strings keep working everywhere and the members work wherever
the strings do, with the same bits."""
import json

import numpy as np
import pytest

import fpsim
from fpsim.autograd import Tensor
from fpsim.autograd.ops_loss import Reduction, cross_entropy, mse_loss
from fpsim.rounding import MODES, RoundingMode, round_to


def test_rounding_modes_are_their_strings():
    assert MODES == ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
    assert tuple(RoundingMode) == MODES and all(type(m) is str for m in MODES)
    assert RoundingMode.NEAREST_EVEN == "nearest_even" and RoundingMode("up") is RoundingMode.UP
    assert {"toward_zero": 1}[RoundingMode.TOWARD_ZERO] == 1
    assert json.dumps([RoundingMode.DOWN]) == '["down"]' and str(RoundingMode.DOWN) == "down"
    assert fpsim.RoundingMode is RoundingMode


@pytest.mark.parametrize("mode", [m for m in MODES if m != "stochastic"])
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3"])
def test_a_mode_given_as_its_member_rounds_bit_for_bit_as_its_string(mode, fmt):
    x = np.random.default_rng(7).standard_normal(5000).astype(np.float32) * 1e3
    x[:4] = [np.inf, -np.inf, np.nan, 2.0 ** -30]
    expected = round_to(x, fmt, mode)
    got = round_to(x, fmt, RoundingMode(mode))
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
    assert round_to(0.1, fmt, RoundingMode(mode)) == round_to(0.1, fmt, mode)


def test_stochastic_rounding_by_member_draws_the_same_stream():
    x = np.linspace(-3, 3, 4097, dtype=np.float32)
    expected = round_to(x, "fp16", "stochastic", seed=11, offset=5)
    got = round_to(x, "fp16", RoundingMode.STOCHASTIC, seed=11, offset=5)
    assert got.tobytes() == expected.tobytes()


def test_a_mistyped_mode_is_named_with_the_closest_one():
    with pytest.raises(ValueError, match="^unknown rounding mode 'nearest_evn'; did you mean "
                                         "'nearest_even'\\? accepted: nearest_even, "):
        round_to(1.0, "fp16", "nearest_evn")
    with pytest.raises(TypeError, match="^unknown rounding mode 3; accepted: "):
        round_to(1.0, "fp16", 3)


def test_reductions_are_their_strings_and_give_the_same_bits():
    assert tuple(Reduction) == ("mean", "sum", "none") and Reduction.SUM == "sum"
    logits = np.array([[2.0, -1.0, 0.5], [0.25, 3.0, -2.0]], np.float32)
    for reduction in Reduction:
        by_member, by_string = (Tensor(logits, requires_grad=True) for _ in range(2))
        a = cross_entropy(by_member, [0, 1], reduction)
        b = cross_entropy(by_string, [0, 1], reduction.value)
        a.backward(np.ones(a.shape, np.float32))
        b.backward(np.ones(b.shape, np.float32))
        assert a.data.tobytes() == b.data.tobytes()
        assert by_member.grad.data.tobytes() == by_string.grad.data.tobytes()
        m = mse_loss(Tensor(logits), Tensor(logits[::-1].copy()), reduction)
        s = mse_loss(Tensor(logits), Tensor(logits[::-1].copy()), reduction.value)
        assert m.data.tobytes() == s.data.tobytes()


def test_a_mistyped_reduction_is_named_with_the_closest_one():
    with pytest.raises(ValueError, match="^unknown mse_loss reduction 'sun'; did you mean "
                                         "'sum'\\? accepted: mean, sum, none$"):
        mse_loss(Tensor([1.0]), Tensor([2.0]), "sun")
