"""DeepSpeed's overflow test against the presets' ``found_inf``, with DeepSpeed as the oracle.

DeepSpeed 0.19.6 (the PyPI release) decides overflow in every optimizer with
``deepspeed.runtime.utils.has_inf_or_nan``: ``not (isfinite(amax) and isfinite(amin))``.
Releases up to 0.19.5 summed each gradient in float32 in ``CheckOverflow`` (the non-ZeRO
``FP16_Optimizer``), which also flags finite gradients whose sum overflows. The presets
``deepspeed`` and ``deepspeed-fp16`` follow 0.19.6 (``overflow_check="nonfinite"``); the
gradients below separate the two rules, and the real DeepSpeed functions, run on CPU tensors,
decide as the presets do.

Optional: skipped without deepspeed (``.ci/run`` installs it: ``pip install --no-deps
deepspeed==0.19.6 hjson einops``)."""
import numpy as np
import pytest

from fpsim.scaling import check_overflow, found_inf, preset

torch = pytest.importorskip("torch", reason="DeepSpeed's overflow test needs torch")

F32_MAX = float(np.finfo(np.float32).max)
INF, NAN = float("inf"), float("nan")

# (name, float32 gradient values, a 0.19.6 overflow?, a sum-test overflow?)
GRADIENTS = [
    ("finite, sum overflows float32", [3e38, 3e38], False, True),
    ("finite, negative sum overflows", [-F32_MAX, -F32_MAX, 1.0], False, True),
    ("finite, largest values cancel", [F32_MAX, -F32_MAX], False, False),
    ("inf + -inf (sum NaN)", [INF, -INF], True, True),
    ("a NaN among finite values", [1.0, NAN, 2.0], True, True),
    ("-inf alone", [-INF], True, True),
    ("fp16's largest value, many times", [65504.0] * 1000, False, False),
    ("empty gradient", [], False, False),
]


@pytest.fixture(scope="module")
def deepspeed_checks():
    """The real DeepSpeed overflow tests: the shared function, ZeRO 1-2's static method, and
    a ``CheckOverflow`` (the non-ZeRO optimizers') over one parameter per gradient."""
    deepspeed = pytest.importorskip("deepspeed", reason="deepspeed not installed: pip install "
                                    "--no-deps deepspeed==0.19.6 hjson einops")
    from deepspeed.runtime.utils import CheckOverflow, has_inf_or_nan
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def check_overflow_of(grads):
        params = []
        for grad in grads:
            param = torch.nn.Parameter(torch.zeros_like(grad))
            param.grad = grad
            params.append(param)
        # no mpu, no engine, no MoE: has_overflow all-reduces nothing, so no process group
        return CheckOverflow(param_groups=[params]).has_overflow(params)

    return {"version": deepspeed.__version__,
            "has_inf_or_nan": lambda g: bool(has_inf_or_nan(g)),
            "zero_1_2": lambda g: bool(DeepSpeedZeroOptimizer._has_inf_or_nan(g)),
            "check_overflow": check_overflow_of}


def float32(values):
    return np.asarray(values, dtype=np.float32)


@pytest.mark.parametrize("name, values, overflow, sum_overflow", GRADIENTS,
                         ids=[g[0] for g in GRADIENTS])
def test_presets_decide_found_inf_as_deepspeed_0_19_6(name, values, overflow, sum_overflow):
    grads = [float32(values)]
    assert found_inf(grads, "nonfinite") is overflow
    assert found_inf(grads, "sum") is sum_overflow
    for preset_name in ("deepspeed", "deepspeed-fp16"):
        assert check_overflow(grads, preset(preset_name).init()) is overflow, preset_name
        older = preset(preset_name, overflow_check="sum").init()
        assert check_overflow(grads, older) is sum_overflow, preset_name


@pytest.mark.parametrize("name, values, overflow, sum_overflow", GRADIENTS,
                         ids=[g[0] for g in GRADIENTS])
def test_deepspeed_own_checks_agree_with_the_presets(deepspeed_checks, name, values, overflow,
                                                     sum_overflow):
    if deepspeed_checks["version"] != "0.19.6":
        pytest.skip(f"pinned to DeepSpeed 0.19.6's rule, found {deepspeed_checks['version']}")
    grad = torch.tensor(values, dtype=torch.float32)
    preset_says = check_overflow([float32(values)], preset("deepspeed").init())
    for check in ("has_inf_or_nan", "zero_1_2"):
        assert deepspeed_checks[check](grad) is preset_says is overflow, check
    assert deepspeed_checks["check_overflow"]([grad]) is overflow
    # 0.19.5's CheckOverflow._has_inf_or_nan, transcribed (torch's own summation order):
    # the rule preset(..., overflow_check="sum") follows
    older = float(grad.float().sum())
    assert (older in (INF, -INF) or older != older) is sum_overflow


def test_deepspeed_agrees_on_random_gradient_sets(deepspeed_checks):
    """Sets of float32 gradients mixing ordinary values, values near the float32 limit (whose
    sums overflow), infs and NaNs: DeepSpeed's ``CheckOverflow`` and the preset agree on
    every set, and the sum test disagrees on some."""
    if deepspeed_checks["version"] != "0.19.6":
        pytest.skip(f"pinned to DeepSpeed 0.19.6's rule, found {deepspeed_checks['version']}")
    rng = np.random.default_rng(29)
    pool = np.float32([0.0, 1.5, -2.0, 3e38, -3e38, 1e38, F32_MAX, INF, -INF, NAN])
    weights = np.array([30, 30, 30, 6, 6, 6, 4, 1, 1, 1], dtype=float)
    state = preset("deepspeed").init()
    sum_disagrees = 0
    for _ in range(300):
        grads = [rng.choice(pool, size=int(rng.integers(0, 6)), p=weights / weights.sum())
                 for _ in range(int(rng.integers(1, 4)))]
        real = deepspeed_checks["check_overflow"]([torch.from_numpy(g) for g in grads])
        assert check_overflow(grads, state) is real, grads
        sum_disagrees += found_inf(grads, "sum") is not real
    assert sum_disagrees > 0
