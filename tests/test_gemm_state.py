"""FP8/FP4 scaling state lives with the layers that run GEMMs (``fpsim.nn.gemm``): the others
hold none, checkpoints keep their layout, and every GEMM is listed by its dotted name."""
from __future__ import annotations

import numpy as np
import pytest

from fpsim import nn
from fpsim.autograd import Tensor, use_policy
from fpsim.nn.gemm import GemmModule, named_gemm_slots

# Linear(32, 32, rng=0)'s extra state after one forward and backward of the input below under
# "fp8-delayed:history=2", as fpsim saved it in checkpoints before the state moved off Module
SAVED_BEFORE = {"fp8": {"": {"states": {
    "grad_output": {"amax_history": [1.0, 0.0], "scale": 1.0},
    "input": {"amax_history": [0.0, 0.984375], "scale": 455.1111145019531},
    "weight": {"amax_history": [0.0, 0.17670951783657074], "scale": 2535.234130859375}},
    "pending": ["backward"]}}}
POLICY = "fp8-delayed:history=2"


def _step(layer):
    with use_policy(POLICY):
        x = Tensor(np.arange(64.0).reshape(2, 32) / 64, requires_grad=True)
        out = layer(x)
        out.backward(np.ones((2, 32), np.float32))
    return out.data, x.grad.data


@pytest.mark.parametrize("make", [nn.ReLU, lambda: nn.Dropout(0.1), lambda: nn.LayerNorm(4),
                                  lambda: nn.Conv2d(1, 2, 3, rng=0), nn.Module,
                                  lambda: nn.Sequential(nn.Linear(2, 2, rng=0))])
def test_modules_without_gemms_hold_no_fp8_state(make):
    module = make()
    assert not isinstance(module, GemmModule) and not hasattr(module, "gemm_slots")
    with pytest.raises(ValueError, match="extra state is|keeps no extra state, got"):
        module.set_extra_state({"fp8": {}})


def test_the_layers_that_run_gemms_hold_it():
    for module in (nn.Linear(2, 2, rng=0), nn.LSTM(2, 2, rng=0),
                   nn.MultiheadAttention(4, 2, rng=0)):
        assert isinstance(module, GemmModule)


def test_a_checkpoints_fp8_state_from_before_loads_and_continues_alike():
    original = nn.Linear(32, 32, rng=0)
    _step(original)
    assert original.extra_state() == SAVED_BEFORE          # the layout is unchanged
    restored = nn.Linear(32, 32, rng=0)
    restored.set_extra_state(SAVED_BEFORE)
    assert restored.extra_state() == SAVED_BEFORE
    for a, b in zip(_step(original), _step(restored)):     # the next step: the same bits
        assert a.tobytes() == b.tobytes()
    assert original.extra_state() == restored.extra_state()


def test_a_gemm_layer_refuses_state_that_is_not_its_fp8_scaling():
    with pytest.raises(ValueError, match=r"Linear keeps no extra state but its GEMMs' FP8 "
                                         r"scaling \(\{'fp8': \{site: state\}\}\), got "):
        nn.Linear(2, 2, rng=0).set_extra_state({"offset": 3})


def test_named_gemm_slots_lists_every_gemm_that_ran_by_dotted_name():
    model = nn.Sequential(nn.Linear(32, 32, rng=0), nn.ReLU(), nn.Linear(32, 32, rng=1),
                          nn.Linear(32, 32, rng=2, fp8=False))
    assert list(named_gemm_slots(model)) == []             # created on first use
    with use_policy(POLICY):
        model(Tensor(np.ones((2, 32))))
    assert [name for name, _ in named_gemm_slots(model)] == ["0", "2"]
    lstm = nn.LSTM(32, 32, rng=0)
    with use_policy(POLICY):
        lstm(Tensor(np.ones((3, 2, 32))))
    assert [name for name, _ in named_gemm_slots(nn.Sequential(lstm))] == ["0.ih", "0.hh"]
