"""jmp's DynamicLossScale and Keras 3's LossScaleOptimizer through the adapters.

Optional: needs jax, jmp and keras (not installed by CI: jaxlib alone is a ~85 MB wheel).
Keras runs on the jax backend here (KERAS_BACKEND=jax unless already set)."""
import os

import numpy as np
import pytest

pytest.importorskip("jax")

from fpsim.conformance import compare, standard_patterns  # noqa: E402
from fpsim.conformance.jax_adapters import JmpAdapter, KerasLossScaleAdapter  # noqa: E402


@pytest.mark.parametrize("jit", [True, False])
def test_jmp_matches_the_jmp_preset(jit):
    pytest.importorskip("jmp")
    total = 0
    for name, flags in standard_patterns("jmp", growth_interval=5):
        flags = flags if jit else flags[:300]
        report = compare(JmpAdapter(period=5, jit=jit), flags, "jmp", growth_interval=5)
        assert report.agree, f"{name}:\n{report}"
        total += len(flags)
    assert total >= (3700 if jit else 2000)


def test_jmp_minimum_and_the_jit_quirk():
    pytest.importorskip("jmp")
    flags = [True] * 30 + [False] * 12
    report = compare(JmpAdapter(init_scale=64.0, period=4, min_loss_scale=4.0, jit=False),
                     flags, "jmp", init_scale=64.0, growth_interval=4, min_scale=4.0)
    assert report.agree, report
    with pytest.raises(ValueError, match="forgets min_loss_scale"):
        JmpAdapter(min_loss_scale=4.0, jit=True)


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    return pytest.importorskip("keras")


def test_keras3_matches_the_keras3_preset(keras):
    """Short patterns: one eager stateless_apply costs ~0.1 s on the jax backend."""
    flags = ([False] * 7 + [True, True] + [False] * 3 + [True] + [False] * 10) * 2
    report = compare(KerasLossScaleAdapter(dynamic_growth_steps=3), flags, "keras3",
                     growth_interval=3)
    assert report.agree, report
    growth = [False] * 40                         # up to 2**15 * 2**13 = 2**28
    assert compare(KerasLossScaleAdapter(dynamic_growth_steps=3), growth, "keras3",
                   growth_interval=3).agree


def test_keras3_on_jax_flushes_the_scale_where_the_preset_goes_subnormal(keras):
    """Found by this check: on the jax backend (XLA CPU flushes subnormal results) the
    collapsing scale goes 2**-126 -> 0, where float32 arithmetic (and the keras3 preset)
    gives 2**-127. Other backends should agree."""
    flags = [True] * 10
    report = compare(KerasLossScaleAdapter(initial_scale=2.0 ** -120), flags, "keras3",
                     init_scale=2.0 ** -120)
    if keras.backend.backend() != "jax":
        assert report.agree, report
        return
    assert not report.agree and report.divergence.step == 6
    assert report.divergence.recorded["scale_before"] == 2.0 ** -126
    assert report.divergence.recorded["scale_after"] == 0.0
    assert report.divergence.expected["scale_after"] == 2.0 ** -127
    assert np.float32(2.0 ** -126) * np.float32(0.5) == np.float32(2.0 ** -127)
    # the preset option that models XLA's flush agrees all the way
    assert compare(KerasLossScaleAdapter(initial_scale=2.0 ** -120), flags, "keras3",
                   init_scale=2.0 ** -120, precision="float32_ftz").agree

