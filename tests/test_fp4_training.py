"""FP4 and FP6 recipes (nvfp4, mxfp4, mxfp6) in the engine and the trainer: the strings, each
GEMM of a quantized linear against nvfp4_quantize / mx_quantize and exact products, what each
NVFP4 ingredient changes, keep=, stochastic rounding across a resume, the CLI's bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from fpsim import backend, nn
from fpsim.backend import xp
from fpsim.autograd import Policy, Tensor, get_policy, linear, use_policy
from fpsim.autograd.ops_fp8 import ScalingSlots
from fpsim.formats import E2M1, E2M3, E3M2
from fpsim.quant import (ScaleRule, ScalingKind, dequantize, mx_quantize, nvfp4_quantize,
                         random_hadamard_transform)
from fpsim.quant.tensor_scaling import fl32
from fpsim.train import Dataset, train
from fpsim.train.checkpoint import load_checkpoint
from fpsim.train.fp8_stats import FP8_TABLE
from fpsim.train.layer_stats import read_step_table

NVFP4_NAMES = ("0.input", "0.weight", "0.grad_output", "0.wgrad_input", "0.wgrad_grad_output")


@pytest.mark.parametrize("spec,kind,fmt,switches", [
    ("nvfp4", ScalingKind.NVFP4, E2M1, (True, True, True)),
    ("NVFP4:rht=0,sr=0,2d=0", ScalingKind.NVFP4, E2M1, (False, False, False)),
    ("nvfp4:sr=false", ScalingKind.NVFP4, E2M1, (True, False, True)),
    ("mxfp4", ScalingKind.MX, E2M1, (True, True, True)),
    ("mxfp6", ScalingKind.MX, E3M2, (True, True, True)),
    ("mxfp6:format=e2m3", ScalingKind.MX, E2M3, (True, True, True)),
])
def test_recipe_strings(spec, kind, fmt, switches):
    policy = get_policy(spec)
    recipe = policy.fp8
    assert (recipe.scaling, recipe.forward, recipe.backward) == (kind, fmt, fmt)
    assert (recipe.rht, recipe.stochastic, recipe.tiles_2d) == switches
    assert policy.matmul.name == "bf16" and policy.param.name == "fp32"
    assert ("rht" in recipe.record()) == (kind is ScalingKind.NVFP4)
    assert json.dumps(recipe.record())


def test_keep_is_a_key_of_every_recipe_and_recorded_only_when_set():
    assert get_policy("mxfp8:keep=2+head.0").fp8.keep == ("2", "head.0")
    assert get_policy("fp8-delayed:history=4,keep=1").fp8.record()["keep"] == ["1"]
    assert "keep" not in get_policy("fp8-delayed:history=4").fp8.record()


@pytest.mark.parametrize("spec,message", [
    ("nvfp4:hrt=0", "FP4 recipe 'nvfp4:hrt=0': unknown key 'hrt' (did you mean 'rht'?); "
                    "nvfp4 takes rht, sr, 2d, acc, keep"),
    ("nvfp4:sr=2", "sr must be 1 or 0 (true/false), got '2'"),
    ("nvfp4:2d=", "'2d' needs a value"),
    ("nvfp4:rht=1,rht=0", "sets 'rht' twice"),
    ("mxfp4:format=e2m3", "unknown key 'format'; mxfp4 takes acc, keep"),
    ("mxfp6:format=e5m2", "FP6 recipe 'mxfp6:format=e5m2': format must be one of e3m2, e2m3, "
                          "got 'e5m2'"),
    ("mxfp6:fromat=e2m3", "did you mean 'format'"),
    ("mxfp8:keep=a+a", "keep names 'a' twice"),
    ("nvfp4:keep=a b", "keep takes module names"),
    ("nvfp4:keep=", "'keep' needs a value"),
    ("nvfp4:acc=nonsense", "unknown accumulation spec"),
])
def test_bad_strings_say_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        get_policy(spec)


# --- each GEMM against a reference ---------------------------------------------------------
def _exact_fp32(a, b) -> np.ndarray:
    """a @ b summed exactly (Fractions), each sum representable in float64 (checked), then
    rounded once to float32."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    fa = [[Fraction(float(v)) for v in row] for row in a]
    fb = [[Fraction(float(v)) for v in col] for col in b.T]
    for i, row in enumerate(fa):
        for j, col in enumerate(fb):
            total = sum(p * q for p, q in zip(row, col))
            assert Fraction(float(total)) == total      # float64 holds it: one rounding below
            out[i, j] = np.float32(float(total))
    return out


def _host(a) -> np.ndarray:
    return backend.to_numpy(a)


def _device(a):
    return backend.asarray(np.ascontiguousarray(a), xp.float32)


def _decoded(q) -> np.ndarray:
    """Elements times their E4M3 block scale (exact in float32), on the host."""
    return _host(q.elements) * np.repeat(_host(q.scales), 16, axis=1)


def _alpha_product(a, qa, b, qb) -> np.ndarray:
    alpha = fl32(fl32(float(qa.amax) * float(qb.amax)) * fl32(1 / (6 * 6 * 448 * 448)))
    return _exact_fp32(a, b) * np.float32(alpha)


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 32)).astype(np.float32)
    w = (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)
    g = (rng.standard_normal((32, 16)) * 1e-3).astype(np.float32)
    return x, w, g


def _engine(policy, x, w, g, slots):
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    with use_policy(policy):
        y = linear(xt, wt, scaling_slots=slots)
        y.backward(g)
    return _host(y.data), _host(xt.grad.data), _host(wt.grad.data)


def _nvfp4_reference(recipe, x, w, g, key):
    """Forward, dgrad and wgrad as the ops_fp4 docstring says, from nvfp4_quantize."""
    qx = nvfp4_quantize(_device(x))
    qw = nvfp4_quantize(_device(w), tile=(16, 16) if recipe.tiles_2d else (1, 16))
    y = _alpha_product(_decoded(qx), qx, _decoded(qw).T, qw)
    sr = ({"mode": "stochastic", "seed": key} if recipe.stochastic else {})
    qg = nvfp4_quantize(_device(g), **sr, **({"offset": 0} if sr else {}))
    qw_cols = qw if recipe.tiles_2d else nvfp4_quantize(_device(w.T))
    w_cols = _decoded(qw_cols) if recipe.tiles_2d else _decoded(qw_cols).T
    dx = _alpha_product(_decoded(qg), qg, w_cols, qw_cols)
    gt, xt = _device(g.T), _device(x.T)
    if recipe.rht:
        gt, xt = random_hadamard_transform(gt), random_hadamard_transform(xt)
    qgt = nvfp4_quantize(gt, **sr, **({"offset": g.size} if sr else {}))
    qxt = nvfp4_quantize(xt)
    dw = _alpha_product(_decoded(qgt), qgt, _decoded(qxt).T, qxt)
    return y, dx, dw, qg


@pytest.mark.parametrize("spec", ["nvfp4", "nvfp4:sr=0", "nvfp4:rht=0", "nvfp4:2d=0",
                                  "nvfp4:rht=0,sr=0,2d=0"])
def test_nvfp4_linear_equals_its_reference_gemm_by_gemm(spec):
    policy = Policy(matmul="fp32", fp8=spec, name=spec)
    x, w, g = _operands()
    slots = ScalingSlots()
    slots.sr_seed = 1234
    y, dx, dw = _engine(policy, x, w, g, slots)
    ry, rdx, rdw, qg = _nvfp4_reference(policy.fp8, x, w, g, 1234)
    for engine, reference in ((y, ry), (dx, rdx), (dw, rdw)):
        np.testing.assert_array_equal(engine, reference)
    assert slots.sr_offset == (2 * g.size if policy.fp8.stochastic else None)
    nearest = nvfp4_quantize(_device(g))
    # sr=0 rounds the gradient to nearest even; sr=1 draws (and so differs somewhere)
    assert np.array_equal(_host(qg.elements), _host(nearest.elements)) == \
        (not policy.fp8.stochastic)


def test_each_nvfp4_ingredient_changes_its_gemm_only():
    x, w, g = _operands(1)
    results = {}
    for spec in ("nvfp4", "nvfp4:rht=0", "nvfp4:sr=0", "nvfp4:2d=0"):
        results[spec] = _engine(Policy(matmul="fp32", fp8=spec, name=spec), x, w, g,
                                ScalingSlots())
    base = results["nvfp4"]
    same = {spec: tuple(np.array_equal(a, b) for a, b in zip(r, base))
            for spec, r in results.items()}
    assert same["nvfp4:rht=0"] == (True, True, False)     # the transform: wgrad only
    assert same["nvfp4:sr=0"] == (True, False, False)     # gradient rounding: dgrad, wgrad
    assert same["nvfp4:2d=0"][0] is False                 # weight tiles: forward (and dgrad)


@pytest.mark.parametrize("spec,fmt", [("mxfp4", E2M1), ("mxfp6", E3M2),
                                      ("mxfp6:format=e2m3", E2M3)])
def test_mx_linear_equals_its_reference(spec, fmt):
    x, w, g = _operands(2)
    w = np.ascontiguousarray(np.concatenate([w, w[::-1] * 0.5]))       # out = 32: dgrad blocks
    g = np.ascontiguousarray(np.concatenate([g, g * 3], axis=1))
    y, dx, dw = _engine(Policy(matmul="fp32", fp8=spec, name=spec), x, w, g, ScalingSlots())

    def q(v, axis):
        return _host(dequantize(mx_quantize(_device(v), fmt, axis=axis,
                                            scale_rule=ScaleRule.RCEIL)))
    np.testing.assert_array_equal(y, _exact_fp32(q(x, -1), q(w, -1).T))
    np.testing.assert_array_equal(dx, _exact_fp32(q(g, -1), q(w, 0)))
    np.testing.assert_array_equal(dw, _exact_fp32(q(g, 0).T, q(x, 0)))


def test_nvfp4_needs_blocks_of_16_and_names_the_keep_key():
    with use_policy("nvfp4"), pytest.raises(ValueError, match="out_features = 4 is not a "
                                            "multiple of 16.*nvfp4:keep=NAME"):
        nn.Linear(32, 4, rng=0)(Tensor(np.ones((16, 32))))


# --- training ------------------------------------------------------------------------------
def _data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    return Dataset(x, (x[:, 0] > x[:, 1]).astype(np.int64), classes=2)


def _same_rows(a, b) -> bool:
    return len(a) == len(b) and all(
        x.step == y.step and all(np.array_equal(getattr(x, f), getattr(y, f), equal_nan=True)
                                 for f in ("scale", "saturated", "flushed"))
        for x, y in zip(a, b))


@pytest.mark.parametrize("recipe", ["nvfp4:keep=2", "nvfp4:rht=0,sr=0,2d=0,keep=2",
                                    "mxfp4:keep=2", "mxfp6:keep=2"])
def test_training_records_stats_and_resumes_bit_for_bit(tmp_path, recipe):
    model = lambda: nn.MLP([32, 32, 2], rng=0)          # noqa: E731  the head: keep=2
    whole = train(model(), _data(), policy=recipe, steps=6, batch_size=32,
                  out=tmp_path / "whole")
    assert np.isfinite(whole.losses).all()
    names, rows = read_step_table(FP8_TABLE, tmp_path / "whole" / "fp8.jsonl")
    nvfp4 = recipe.startswith("nvfp4")
    assert names == whole.fp8_names == (NVFP4_NAMES if nvfp4 else NVFP4_NAMES[:3])
    assert _same_rows(rows, whole.fp8) and len(rows) == 6
    assert all(0 <= v <= 1 for row in rows for v in row.saturated + row.flushed)
    assert all(np.isfinite(row.scale).all() == nvfp4 for row in rows)
    train(model(), _data(), policy=recipe, steps=3, batch_size=32, out=tmp_path / "part")
    _, meta = load_checkpoint(tmp_path / "part" / "checkpoint.npz")
    if recipe == "nvfp4:keep=2":       # the stochastic counter travels with the checkpoint
        assert meta["modules"]["0"]["fp8"][""]["stochastic"]["offset"] == 3 * 2 * 32 * 32
    resumed = train(model(), _data(), policy=recipe, steps=6, batch_size=32,
                    out=tmp_path / "part", resume=tmp_path / "part" / "checkpoint.npz")
    assert resumed.loss_hash == whole.loss_hash
    assert _same_rows(read_step_table(FP8_TABLE, tmp_path / "part" / "fp8.jsonl")[1], rows)


# the same bits on every backend (tests/engine_reruns.py runs this file on torch and
# numpy-strict): stochastic draws, the transform and the block scales included
PINNED = {"nvfp4:keep=2": "006c8a1fa431ddd30d8ea7e50f0285783f7eab60497d0d78c7e2a2361b5c5b16",
          "mxfp4:keep=2": "b85a8778415d3bbb2ff78cefaffbdc984f398bad9ff89b0e96fb48a139e13a82",
          "mxfp6:keep=2": "5b5c5f4c96920a8209456c750cc8466f6760003f45f91d2dacccea26e9274ae1"}


@pytest.mark.parametrize("recipe", sorted(PINNED))
def test_pinned_losses_on_every_backend(recipe):
    run = train(nn.MLP([32, 32, 2], rng=0), _data(), policy=recipe, steps=4, batch_size=32)
    assert run.loss_hash == PINNED[recipe]


def test_stochastic_rounding_is_keyed_by_the_run_seed():
    losses = [train(nn.MLP([32, 32, 2], rng=0), _data(), policy="nvfp4:keep=2", steps=4,
                    batch_size=32, seed=seed).losses for seed in (0, 0)]
    np.testing.assert_array_equal(*losses)
    runs = {}
    for seed in (0, 1):      # same batches (fixed by index below), other draws
        model = nn.MLP([32, 32, 2], rng=0)
        train(model, _data(), policy="nvfp4:keep=2", steps=1, batch_size=32, seed=seed)
        runs[seed] = model[0].gemm_slots().sr_seed
    assert runs[0] != runs[1]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(32, 32, rng=0)
        self.head = nn.Linear(32, 2, rng=1)

    def forward(self, x):
        return self.head(self.body(x))


def test_keep_equals_linear_fp8_false_and_refuses_unknown_names():
    kept = train(nn.MLP([32, 32, 2], rng=0), _data(), policy="nvfp4:keep=2", steps=3,
                 batch_size=32)
    model = nn.MLP([32, 32, 2], rng=0)
    model[2].fp8 = False
    by_hand = train(model, _data(), policy="nvfp4", steps=3, batch_size=32)
    assert kept.loss_hash == by_hand.loss_hash and kept.fp8_names == by_hand.fp8_names
    with pytest.raises(ValueError, match=r"keep names '3', which is not a module of this "
                                         r"model; its Linear layers are 0, 2"):
        train(nn.MLP([32, 32, 2], rng=0), _data(), policy="nvfp4:keep=3", steps=1)
    with pytest.raises(ValueError, match=r"keep names 'haed', .* \(did you mean 'head'\?\); "
                                         r"its Linear layers are body, head"):
        train(_Net(), _data(), policy="nvfp4:keep=haed", steps=1)
    assert train(_Net(), _data(), policy="nvfp4:keep=head", steps=1, batch_size=32).fp8_names \
        == tuple(name.replace("0.", "body.") for name in NVFP4_NAMES)
    with pytest.raises(ValueError, match="module '1' \\(ReLU\\) runs no GEMM"):
        train(nn.MLP([32, 32, 2], rng=0), _data(), policy="nvfp4:keep=1+2", steps=1)
    model = nn.MLP([32, 32, 2], rng=0)
    train(model, _data(), policy="mxfp4:keep=2", steps=1, batch_size=32)
    assert not getattr(model[2], "high_precision", False)     # the flag lasts the run only


# --- the CLI, sweeps, plots ----------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fpsim", *args], capture_output=True,
                          text=True)


@pytest.mark.host_only
@pytest.mark.parametrize("policy,message", [
    ("nvfp4:hrt=0", "unknown key 'hrt' (did you mean 'rht'?)"),
    ("nvfp4:sr=2", "sr must be 1 or 0 (true/false), got '2'"),
    ("nvfp4:sr=1,sr=0", "sets 'sr' twice"),
    ("mxfp6:format=e4m3", "format must be one of e3m2, e2m3, got 'e4m3'"),
    ("mxfp4:keep=head", "keep names 'head', which is not a module of this model"),
    ("mxfp4", "mxfp4: MX blocks are 32 elements"),
    ("nvfp4", "out_features = 4 is not a multiple of 16"),
])
def test_cli_refuses_bad_fp4_recipes_in_one_line_before_writing(tmp_path, policy, message):
    out = tmp_path / "run"
    done = _cli("train", "--data", "teacher", "--features", "32", "--hidden", "64",
                "--policy", policy, "--steps", "2", "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stderr.startswith("fpsim: error: ")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    if "blocks are" in message or "multiple of" in message:
        assert ":keep=NAME" in done.stderr        # what the CLI user can do
    assert not out.exists()


@pytest.mark.host_only
def test_cli_trains_the_default_model_with_its_head_kept_and_plots_it(tmp_path):
    done = _cli("train", "--data", "teacher", "--features", "32", "--hidden", "64",
                "--policy", "nvfp4:keep=2", "--steps", "3", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    names, rows = read_step_table(FP8_TABLE, tmp_path / "run" / "fp8.jsonl")
    assert names == NVFP4_NAMES and len(rows) == 3
    done = _cli("plot", "--fp8", str(tmp_path / "run"), "--out", str(tmp_path / "a.png"))
    assert done.returncode == 0, done.stderr and (tmp_path / "a.png").stat().st_size > 0


@pytest.mark.host_only
def test_a_sweep_cell_takes_the_fp4_strings():
    from fpsim.sweep.cells import expand, run_cell
    from fpsim.sweep.spec import parse_spec
    spec = parse_spec('[base]\ndata = "teacher"\nfeatures = 32\nhidden = "32"\nsteps = 2\n'
                      '[grid]\npolicy = ["nvfp4:keep=2", "mxfp6:format=e2m3,keep=2"]\n')
    for cell in expand(spec):
        payload = run_cell(cell)
        assert payload["row"]["status"] == "ok", payload["row"]
        assert json.loads(payload["files"]["fp8.jsonl"].splitlines()[0])["tensors"][0] == \
            "0.input"
    with pytest.raises(ValueError, match="sr must be 1 or 0"):
        parse_spec('[base]\ndata = "teacher"\n[grid]\npolicy = ["nvfp4:sr=maybe"]\n')
