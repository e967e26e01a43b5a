"""FP8 recipes in the engine and the trainer: recipe strings, where delayed scaling records and
updates, the quantized linear's arithmetic by hand, fp8.jsonl, resume, the CLI's bad input."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from fpsim import nn
from fpsim.nn.gemm import named_gemm_slots
from fpsim.autograd import Policy, Tensor, get_policy, linear, no_grad, use_policy
from fpsim.autograd.ops_fp8 import ScalingSlots
from fpsim.formats import E4M3FN, E5M2
from fpsim.quant.recipe import MAX_HISTORY, MAX_MARGIN, Fp8Recipe, ScalingKind, get_recipe
from fpsim.quant.tensor_scaling import (FLT_MAX, AmaxAlgorithm, fl32, init_delayed, record_amax,
                                        scale_from_amax, update_delayed)
from fpsim.rounding import round_to
from fpsim.train import Dataset, train
from fpsim.train.fp8_stats import FP8_TABLE
from fpsim.train.layer_stats import read_step_table

FP32_FP8 = Policy(matmul="fp32", fp8="fp8-delayed:history=3", name="fp8-delayed-fp32")


@pytest.mark.parametrize("spec,message", [
    ("fp8-delayed:histroy=16", "did you mean 'history'"),
    ("fp8-delayed:history=0", "history must be an integer from 1 to 16384, got 0"),
    ("fp8-delayed:history=100000000", "history must be an integer from 1 to 16384, got 1000"),
    ("fp8-delayed:margin=-1", "margin must be an integer from 0 to 8, got -1"),
    ("fp8-delayed:margin=150", "'fp8-delayed:margin=150': margin must be an integer from 0 "
                               "to 8, got 150"),
    ("fp8-delayed:margin=1.5", "margin must be an integer from 0 to 8, got '1.5'"),
    ("fp8-delayed:algo=mean", "unknown algorithm 'mean'; accepted: max, most_recent"),
    ("fp8-current:format=e5m2", "format must be one of hybrid, e4m3"),
    ("fp8-current:power2=maybe", "power2 must be 1 or 0"),
    ("fp8-current:epsilon=-1", r"epsilon must be a number in \[0.0, 3.4028234663852886e\+38\], "
                               r"got -1.0$"),
    ("fp8-current:epsilon=1e39", r"epsilon must be a number in \[0.0, .*\], got 1e\+39$"),
    ("fp8-current:epsilon=nan", "epsilon must be .*, got nan"),
    ("fp8-current:epsilon=tiny", "epsilon must be a number, got 'tiny'"),
    ("mxfp8:history=4", "mxfp8 takes format, acc"),
    ("fp8-delayed:history=4,history=5", "sets 'history' twice"),
    ("fp8-delayed:history", "needs a value"),
    ("fp8-current:acc=nonsense", "unknown accumulation spec"),
])
def test_bad_recipe_strings_say_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message):
        get_policy(spec)


@pytest.mark.parametrize("settings,error,message", [
    ({"history": 10 ** 20}, ValueError, "history must be an integer from 1 to 16384"),
    ({"history": 0}, ValueError, "history must be an integer from 1 to 16384, got 0"),
    ({"history": 16.0}, TypeError, "history must be an integer"),
    ({"margin": 150}, ValueError, "margin must be an integer from 0 to 8, got 150"),
    ({"margin": True}, TypeError, "margin must be an integer from 0 to 8, got True"),
    ({"epsilon": -1.0}, ValueError, r"epsilon must be a number in \[0.0, 3.40"),
    ({"epsilon": 1e39}, ValueError, r"epsilon must be a number in \[0.0, 3.40"),
    ({"epsilon": "0"}, TypeError, r"epsilon must be a number in \[0.0, 3.40.*\], got '0'"),
    ({"algorithm": "mean"}, ValueError, "unknown algorithm 'mean'; accepted: max, most_recent"),
    ({"algorithm": 1}, TypeError, "unknown algorithm 1; accepted: max, most_recent"),
    ({"power_2": 1}, TypeError, "power_2 must be True or False"),
    ({"forward": "e4m3"}, TypeError, "forward must be an FP8 Format"),
    ({"accumulation": "exact"}, TypeError, "accumulation must be an Accumulation"),
])
def test_the_recipe_class_checks_what_the_strings_check(settings, error, message):
    with pytest.raises(error, match=message):
        Fp8Recipe(ScalingKind.DELAYED, **settings)


def test_the_recipe_class_keeps_python_numbers():
    recipe = Fp8Recipe(ScalingKind.DELAYED, history=np.int64(4), margin=np.int32(2),
                       algorithm="most_recent")
    assert recipe.record()["history"] == 4 and type(recipe.history) is int
    assert type(recipe.margin) is int and recipe.algorithm is AmaxAlgorithm.MOST_RECENT
    assert json.dumps(recipe.record())      # run.json takes it
    current = Fp8Recipe(ScalingKind.CURRENT, epsilon=np.float32(0.5), power_2=np.bool_(True))
    assert type(current.epsilon) is float and current.power_2 is True
    assert json.dumps(current.record())


@pytest.mark.parametrize("kind,settings,message", [
    # the example: every bad value is refused, the first named
    (ScalingKind.MX, dict(history=-5, margin="x", epsilon=-1.0),
     "history must be an integer from 1 to 16384, got -5"),
    # a setting the kind does not use (its engine would ignore it) is refused, not dropped
    (ScalingKind.MX, dict(history=5), "history is not a setting of mx scaling \\(it takes "
                                      "forward, backward, accumulation, keep; history stays "
                                      "1024\\), got history=5"),
    (ScalingKind.CURRENT, dict(margin=2), "margin is not a setting of current scaling"),
    (ScalingKind.DELAYED, dict(epsilon=1e-12), "epsilon is not a setting of delayed scaling"),
    (ScalingKind.DELAYED, dict(rht=False), "rht is not a setting of delayed scaling"),
    (ScalingKind.NVFP4, dict(power_2=True), "power_2 is not a setting of nvfp4 scaling"),
    (ScalingKind.BLOCK, dict(power_2=False), "power_2 is not a setting of block scaling .*"
                                             "power_2 stays True"),
    # formats: a pair the kind takes
    (ScalingKind.CURRENT, dict(forward=E5M2), "current scaling takes forward/backward formats "
                                              "e4m3fn/e5m2, e4m3fn/e4m3fn, got e5m2/e5m2"),
    (ScalingKind.NVFP4, dict(forward=E4M3FN, backward=E4M3FN),
     "nvfp4 scaling takes forward/backward formats fp4_e2m1/fp4_e2m1, got e4m3fn/e4m3fn"),
])
def test_the_recipe_class_refuses_what_its_kind_does_not_use(kind, settings, message):
    with pytest.raises(ValueError, match=message):
        Fp8Recipe(kind, **settings)


def test_the_recipe_class_takes_its_kinds_defaults_and_equals_the_strings_recipe():
    from fpsim.formats import E2M1
    assert Fp8Recipe(ScalingKind.NVFP4).forward is E2M1
    assert Fp8Recipe(ScalingKind.BLOCK).power_2 is True
    assert Fp8Recipe("delayed", history=16) == get_recipe("fp8-delayed:history=16")
    for spec in ("fp8-current", "mxfp8", "fp8-block", "nvfp4", "mxfp4"):
        built = get_recipe(spec)
        assert Fp8Recipe(built.scaling, built.forward, built.backward) == built
    with pytest.raises(ValueError, match="unknown scaling 'delayd'; did you mean 'delayed'"):
        Fp8Recipe("delayd")


@pytest.mark.parametrize("fmt", [E4M3FN, E5M2])
def test_the_largest_margin_keeps_every_scale_and_its_inverse_finite(fmt):
    """MAX_MARGIN is tight: at it, an amax at float32's largest still gives a scale > 0
    whose inverse is finite; one more and e4m3fn's inverse overflows."""
    def scale(margin: int) -> float:
        state = record_amax(init_delayed(2), FLT_MAX)
        return update_delayed(state, fmt, margin=margin).scale

    assert scale(MAX_MARGIN) > 0 and math.isfinite(fl32(1.0 / scale(MAX_MARGIN)))
    if fmt is E4M3FN:
        assert not math.isfinite(fl32(1.0 / scale(MAX_MARGIN + 1)))


def test_the_longest_history_is_quick():
    state = init_delayed(MAX_HISTORY)
    began = time.perf_counter()
    for step in range(10):
        state = update_delayed(record_amax(state, 1.0 + step), E4M3FN)
    assert time.perf_counter() - began < 5.0      # about 0.05 s; 10**8 took minutes


def test_recipe_policies():
    policy = get_policy("fp8-delayed:history=16,margin=2,algo=most_recent,format=e4m3")
    recipe = policy.fp8
    assert (recipe.scaling, recipe.history, recipe.margin, recipe.algorithm.value) == \
        (ScalingKind.DELAYED, 16, 2, "most_recent")
    assert recipe.backward is E4M3FN
    assert policy.matmul.name == "bf16" and policy.param.name == "fp32"
    assert get_policy("fp8-block").fp8.power_2 and not get_policy("fp8-current").fp8.power_2
    assert get_recipe("fp8-current:acc=h100-fp8:promote=128").accumulation is not None


def test_quantized_linear_by_hand():
    """y = round( fl32(sum q_x q_w) * fl32(sx_inv * sw_inv) ) with current scaling."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((3, 6)).astype(np.float32)
    with use_policy(Policy(matmul="fp32", fp8="fp8-current")):
        y = linear(Tensor(x), Tensor(w)).data
    sx = scale_from_amax(float(np.max(np.abs(x))), E4M3FN)
    sw = scale_from_amax(float(np.max(np.abs(w))), E4M3FN)
    qx = round_to(x * np.float32(sx), E4M3FN, saturate=True)
    qw = round_to(w * np.float32(sw), E4M3FN, saturate=True)
    exact = qx.astype(np.float64) @ qw.T.astype(np.float64)       # small: exact in float64
    factor = np.float32(np.float32(1 / np.float32(sx)) * np.float32(1 / np.float32(sw)))
    np.testing.assert_array_equal(y, exact.astype(np.float32) * factor)


def _step(layer, x, g):
    with use_policy(FP32_FP8):
        out = layer(Tensor(x, requires_grad=True))
        out.backward(g)


def test_delayed_scaling_records_and_updates_where_te_does():
    layer = nn.Linear(4, 2, bias=False, rng=0)
    x1 = np.full((2, 4), 3.0, np.float32)
    g = np.ones((2, 2), np.float32)
    _step(layer, x1, g)                       # step 0 casts with scale 1 (TE's initial scale)
    slots = layer.gemm_slots()
    assert slots.states["input"].scale == 448.0 / 3.0 or \
        slots.states["input"].scale == float(np.float32(448) / np.float32(3))
    assert slots.states["input"].amax_history == (0.0, 0.0, 3.0)
    assert slots.states["grad_output"].amax_history[0] == 1.0    # its update is pending
    assert slots.pending == {"backward"}
    with use_policy(FP32_FP8), no_grad():     # evaluation reads the scales, records nothing
        layer(Tensor(np.full((2, 4), 100.0, np.float32)))
    assert slots.states["input"].amax_history == (0.0, 0.0, 3.0)
    with use_policy(FP32_FP8):                # a layer used twice in a step: one amax
        a = layer(Tensor(np.full((2, 4), 2.0, np.float32), requires_grad=True))
        b = layer(Tensor(np.full((2, 4), 5.0, np.float32), requires_grad=True))
        assert slots.states["grad_output"].amax_history == (0.0, 0.0, 1.0)   # bwd updated
        (a + b).backward(g)
    assert slots.states["input"].amax_history == (0.0, 3.0, 5.0)


def test_delayed_scaling_needs_slots_outside_modules():
    with use_policy("fp8-delayed"), pytest.raises(ValueError, match="amax history per GEMM"):
        linear(Tensor(np.ones((2, 2))), Tensor(np.ones((2, 2))))
    with use_policy("fp8-delayed"):
        linear(Tensor(np.ones((2, 2))), Tensor(np.ones((2, 2))), scaling_slots=ScalingSlots())


def test_mx_needs_blocks_of_32():
    with use_policy("mxfp8"), pytest.raises(ValueError, match="in_features = 20 is not a "
                                                              "multiple of 32"):
        nn.Linear(20, 32, rng=0)(Tensor(np.ones((2, 20))))
    head = nn.Linear(32, 3, rng=0, fp8=False)            # a head kept out of the recipe
    with use_policy("mxfp8"):
        out = head(Tensor(np.ones((2, 32)), requires_grad=True))
        out.backward(np.ones((2, 3), np.float32))
    assert dict(named_gemm_slots(head)) == {}


def _same_rows(a, b) -> bool:
    """Rows equal field by field, NaN equal to NaN (a scale not measured)."""
    return len(a) == len(b) and all(
        x.step == y.step and all(np.array_equal(getattr(x, f), getattr(y, f), equal_nan=True)
                                 for f in ("scale", "saturated", "flushed"))
        for x, y in zip(a, b))


def _data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    return Dataset(x, (x[:, 0] > x[:, 1]).astype(np.int64), classes=2)


def _model():
    model = nn.MLP([32, 32, 2], rng=0)
    model[2].fp8 = False
    return model


@pytest.mark.parametrize("recipe", ["fp8-current", "fp8-delayed:history=4", "mxfp8",
                                    "fp8-block"])
def test_training_writes_fp8_stats_and_resumes_bit_for_bit(tmp_path, recipe):
    whole = train(_model(), _data(), policy=recipe, steps=6, batch_size=32,
                  out=tmp_path / "whole")
    names, rows = read_step_table(FP8_TABLE, tmp_path / "whole" / "fp8.jsonl")
    assert names == ("0.input", "0.weight", "0.grad_output") == whole.fp8_names
    assert _same_rows(rows, whole.fp8) and len(rows) == 6
    assert all(0 <= v <= 1 for row in rows for v in row.saturated + row.flushed)
    per_tensor = recipe.startswith("fp8-current") or recipe.startswith("fp8-delayed")
    assert all(np.isfinite(row.scale).all() == per_tensor for row in rows)
    run = json.loads((tmp_path / "whole" / "run.json").read_text())
    config = run["config"]
    assert config["policy"] == recipe and config["recipe"]["master"] == "fp32"
    assert config["fp8"]["recipe"] == recipe and config["fp8"]["forward"] == "e4m3fn"
    train(_model(), _data(), policy=recipe, steps=3, batch_size=32, out=tmp_path / "part")
    resumed = train(_model(), _data(), policy=recipe, steps=6, batch_size=32,
                    out=tmp_path / "part", resume=tmp_path / "part" / "checkpoint.npz")
    assert resumed.loss_hash == whole.loss_hash
    assert _same_rows(read_step_table(FP8_TABLE, tmp_path / "part" / "fp8.jsonl")[1], rows)


def test_recipes_differ_from_bf16_and_each_other():
    losses = {}
    for recipe in ("bf16-mixed", "fp8-current", "fp8-delayed:history=4"):
        losses[recipe] = train(_model(), _data(), policy=recipe, steps=8, batch_size=32).losses
    assert not np.array_equal(losses["bf16-mixed"], losses["fp8-current"])
    assert not np.array_equal(losses["fp8-current"], losses["fp8-delayed:history=4"])


@pytest.mark.host_only
@pytest.mark.parametrize("policy,message", [
    ("fp8-delayed:history=0", "history must be an integer from 1 to 16384, got 0"),
    ("fp8-delayed:history=100000000", "history must be an integer from 1 to 16384, got 1"),
    ("fp8-delayed:margin=150", "margin must be an integer from 0 to 8, got 150")])
def test_cli_refuses_a_bad_recipe_before_writing(tmp_path, policy, message):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fpsim", "train", "--data", "teacher",
                           "--policy", policy, "--steps", "2",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stderr.startswith("fpsim: error: ")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.host_only
def test_cli_refuses_a_model_mx_cannot_block_before_writing(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fpsim", "train", "--data", "teacher",
                           "--features", "32", "--hidden", "64", "--policy", "mxfp8",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "out_features = 4 is not a multiple of 32" in done.stderr
    assert not out.exists()


@pytest.mark.host_only
def test_a_sweep_cell_takes_a_recipe_and_keeps_its_fp8_stats():
    from fpsim.sweep.cells import expand, run_cell
    from fpsim.sweep.spec import parse_spec
    spec = parse_spec('[base]\ndata = "teacher"\nfeatures = 32\nhidden = "32"\nsteps = 3\n'
                      '[grid]\npolicy = ["fp8-delayed:history=2", "fp8-current"]\n')
    for cell in expand(spec):
        payload = run_cell(cell)
        assert payload["row"]["status"] == "ok", payload["row"]
        header = json.loads(payload["files"]["fp8.jsonl"].splitlines()[0])
        assert header["tensors"][:3] == ["0.input", "0.weight", "0.grad_output"]
    with pytest.raises(ValueError, match="history must be an integer from 1 to 16384"):
        parse_spec('[base]\ndata = "teacher"\n[grid]\npolicy = ["fp8-delayed:history=0"]\n')


@pytest.mark.host_only
def test_fpsim_plot_fp8_draws_the_run_and_refuses_what_it_cannot(tmp_path):
    train(_model(), _data(), policy="fp8-delayed:history=2", steps=4, batch_size=32,
          out=tmp_path / "run")
    command = [sys.executable, "-m", "fpsim", "plot", "--fp8", str(tmp_path / "run")]
    done = subprocess.run(command + ["--out", str(tmp_path / "a.png")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    subprocess.run(command + ["--out", str(tmp_path / "b.png")], check=True,
                   capture_output=True)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    train(_model(), _data(), policy="bf16-mixed", steps=2, batch_size=32,
          out=tmp_path / "bf16")
    done = subprocess.run([sys.executable, "-m", "fpsim", "plot", "--fp8",
                           str(tmp_path / "bf16"), "--out", str(tmp_path / "c.png")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "no fp8.jsonl" in done.stderr
    assert not (tmp_path / "c.png").exists()


def test_the_recipe_modules_examples_hold():
    import doctest
    import fpsim.quant.recipe
    result = doctest.testmod(fpsim.quant.recipe)
    assert result.attempted > 0 and result.failed == 0
