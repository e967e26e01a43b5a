"""The one validation vocabulary (fpsim.options): one exception type per kind of mistake (a
wrong type is a TypeError, a right type with a bad value a ValueError), the same sentence
wherever an option is checked, and a suggestion for a mistyped choice."""
import math

import numpy as np
import pytest

from fpsim.optim import SGD, Adam
from fpsim.options import check_choice, check_float32


def test_a_mistyped_choice_names_the_closest_one():
    with pytest.raises(ValueError) as err:
        check_choice("rounding mode", "nearest_evn", ("nearest_even", "toward_zero", "up"))
    assert str(err.value) == ("unknown rounding mode 'nearest_evn'; did you mean "
                              "'nearest_even'? accepted: nearest_even, toward_zero, up")


def test_a_choice_far_from_every_one_gets_no_suggestion():
    with pytest.raises(ValueError) as err:
        check_choice("mode", "sideways", ("nearest_even", "stochastic"))
    assert str(err.value) == "unknown mode 'sideways'; accepted: nearest_even, stochastic"


@pytest.mark.parametrize("value,low,kwargs,expected", [
    (0.1, 0.0, dict(low_open=True), 0.1),
    (np.float32(0.5), 0.0, {}, float(np.float32(0.5))),
    (2.0 ** -149, 0.0, dict(low_open=True), 2.0 ** -149),     # float32's smallest: kept
    (3.4028234663852886e38, 0.0, {}, 3.4028234663852886e38),  # and its largest
    (0, 0.0, {}, 0.0),
])
def test_float32_check_returns_the_value_as_a_python_float(value, low, kwargs, expected):
    checked = check_float32("x", value, low, **kwargs)
    assert type(checked) is float and checked == expected


@pytest.mark.parametrize("value,kind,message", [
    ("0.1", TypeError, r"^lr must be a number in \(0.0, inf\), got '0.1'$"),
    (True, TypeError, r"^lr must be a number in \(0.0, inf\), got True$"),
    (None, TypeError, r"^lr must be a number in \(0.0, inf\), got None$"),
    (0.0, ValueError, r"^lr must be a number in \(0.0, inf\), got 0.0$"),
    (math.nan, ValueError, r"^lr must be a number in \(0.0, inf\), got nan$"),
    (math.inf, ValueError, r"^lr must be a number in \(0.0, inf\), got inf$"),
    (10 ** 400, ValueError, r"^lr must be a number in \(0.0, inf\), got 1000"),  # > a float
    (1e-50, ValueError, r"^lr=1e-50 is 0.0 in float32, the format it is used in; give a "
                        r"value in \(0.0, inf\) that float32 keeps there"),
    (1e39, ValueError, r"^lr=1e\+39 is inf in float32"),
])
def test_float32_check_refuses_with_one_sentence_of_the_right_kind(value, kind, message):
    with pytest.raises(kind, match=message):
        check_float32("lr", value, 0.0, low_open=True)


def test_float32_check_honours_closed_and_open_upper_ends():
    assert check_float32("p", 1.0, 0.0, 1.0) == 1.0
    with pytest.raises(ValueError, match=r"^beta must be a number in \[0.0, 1.0\), got 1.0$"):
        check_float32("beta", 1.0, 0.0, 1.0, high_open=True)
    with pytest.raises(ValueError, match=r"beta=.* is 1.0 in float32"):
        check_float32("beta", 1 - 1e-10, 0.0, 1.0, high_open=True)


@pytest.mark.parametrize("make,kind,message", [
    # a flag that is not a bool is a wrong type, whether given to a Tensor or an optimizer
    (lambda: SGD(lr=0.1, momentum=0.9, nesterov="yes"), TypeError,
     "^nesterov must be True or False, got 'yes'$"),
    (lambda: Adam(lr=1e-3, decoupled=1), TypeError, "^decoupled must be True or False, got 1$"),
    (lambda: SGD(lr="0.1"), TypeError, r"^lr must be a number in \(0.0, inf\), got '0.1'$"),
    (lambda: SGD(lr=0.1, momentum=True), TypeError, r"^momentum must be a number in \[0.0, "),
    (lambda: SGD(lr=-0.1), ValueError, r"^lr must be a number in \(0.0, inf\), got -0.1$"),
    (lambda: Adam(lr=1e-3, beta1=1.0), ValueError, r"^beta1 must be a number in \[0.0, 1.0\)"),
])
def test_optimizer_rules_raise_the_vocabularys_exceptions(make, kind, message):
    with pytest.raises(kind, match=message):
        make()


def test_a_tensor_flag_and_an_optimizer_flag_fail_alike():
    from fpsim.autograd import Tensor
    kinds = []
    for make in (lambda: Tensor([1.0], requires_grad="yes"),
                 lambda: SGD(lr=0.1, momentum=0.9, nesterov="yes")):
        with pytest.raises(Exception) as err:
            make()
        kinds.append(type(err.value))
    assert kinds == [TypeError, TypeError]


def test_numpy_bool_flags_are_stored_as_python_bools():
    rule = SGD(lr=0.1, momentum=0.9, nesterov=np.bool_(True))
    assert rule.nesterov is True
    assert Adam(lr=1e-3, decoupled=np.bool_(False)).decoupled is False
