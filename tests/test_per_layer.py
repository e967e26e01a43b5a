"""Per-layer statistics (issue 26): each op's rounding of a parameter's gradient is charged to
that parameter (checked against the same rounding done with NumPy), every parameter of the
built-in layers is measured, train(per_layer=True) writes layers.jsonl that a resumed run
continues byte for byte, and fpsim plot --per-layer draws it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fpsim import backend, nn, use_policy
from fpsim.autograd import Tensor, cross_entropy, linear
from fpsim.cli import main
from fpsim.exact.underflow import count_gradient_underflow, count_per_tensor
from fpsim.optim import SGD, Optimizer
from fpsim.train import make_dataset, train
from fpsim.train.layer_stats import read_layer_stats
from fpsim.train.losses import batch_inputs
from fpsim.train.models import TokenTransformer


def test_a_linear_layers_gradient_roundings_are_charged_to_weight_and_bias():
    """16-true: dW = g.T @ x is exact in float64 here (small dyadic values, products of
    2**-26 and its multiples) and rounded once to fp16, whose smallest step is 2**-24;
    NumPy's float16 cast of the same sums gives the flushes."""
    rng = np.random.default_rng(0)
    x = (rng.integers(-3, 4, (6, 4)) * 2.0 ** -8).astype(np.float32)
    g = (rng.integers(-3, 4, (6, 2)) * 2.0 ** -18).astype(np.float32)
    with use_policy("16-true"):
        w = Tensor(rng.integers(-2, 3, (2, 4)).astype(np.float32), requires_grad=True)
        b = Tensor(np.zeros(2, np.float32), requires_grad=True)
        y = linear(Tensor(x), w, b)
        with count_gradient_underflow() as total, count_per_tensor() as charged:
            y.backward(g)
    flushed = []
    for tensor, exact in ((w, g.T.astype(np.float64) @ x), (b, g.astype(np.float64).sum(0))):
        rounded = exact.astype(np.float16)
        expected = (int(np.count_nonzero((exact != 0) & (rounded == 0))),
                    int(np.count_nonzero(exact)))
        counts = charged[id(tensor)]
        assert (counts.flushed, counts.nonzero) == expected
        assert np.array_equal(backend.to_numpy(tensor.grad.data), rounded.astype(np.float32))
        flushed.append(expected[0])
    assert flushed[0] > 0 and flushed[1] == 0      # the weight's products underflow, g's sums not
    assert total.flushed >= sum(charged[id(t)].flushed for t in (w, b))


def models():
    with use_policy("16-mixed"):
        yield "mlp", nn.MLP([4, 8, 3], rng=0), np.ones((6, 4), np.float32), np.arange(6) % 3
        yield ("cnn", nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, rng=0), nn.BatchNorm2d(2),
                                    nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(2, 2, 3, padding=1,
                                                                          rng=1),
                                    nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 3, rng=2)),
               np.random.default_rng(1).standard_normal((6, 1, 4, 4)).astype(np.float32),
               np.arange(6) % 3)
        yield ("transformer", TokenTransformer(5, 3, 4, d_model=8, heads=2, blocks=1),
               np.arange(12).reshape(3, 4) % 5, np.arange(12).reshape(3, 4) % 3)


@pytest.mark.parametrize("name,model,x,y", list(models()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_every_parameter_of_the_built_in_layers_is_measured(name, model, x, y):
    with use_policy("16-mixed"):
        logits = model(batch_inputs(x))
        loss = cross_entropy(logits.reshape(-1, 3), y.reshape(-1))
        with count_per_tensor() as charged:
            loss.backward(np.float32(2.0 ** -12))
    for param_name, p in model.named_parameters():
        assert charged.get(id(p)) is not None, f"{name}: {param_name} not measured"
        assert charged[id(p)].nonzero <= charged[id(p)].values


def test_train_per_layer_writes_layers_jsonl_and_resumes_it_byte_for_byte(tmp_path):
    data = make_dataset("images", 128, classes=3, seed=0, size=8)

    def cnn():
        with use_policy("16-true"):
            return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=0), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(64, 3, rng=1))
    def sgd(model):      # fp16 weights, no master copy: small updates are lost
        with use_policy("16-true"):
            return Optimizer(model, SGD(lr=1e-3), master=None)
    common = dict(steps=8, batch_size=16, policy="16-true", scaler=None, progress=False,
                  per_layer=True)
    first = cnn()
    whole = train(first, data, optimizer=sgd(first), out=tmp_path / "whole", **common)
    assert whole.layer_names == ("0.weight", "0.bias", "4.weight", "4.bias")
    names, steps = read_layer_stats(tmp_path / "whole" / "layers.jsonl")
    assert names == whole.layer_names and steps == whole.layers and len(steps) == 8
    assert any(v > 0 for s in steps for v in s.lost_updates)       # fp16 weights, no master
    assert all(0 <= v <= 1 for s in steps for v in s.grad_underflow + s.lost_updates)
    model = cnn()
    optimizer = sgd(model)
    train(model, data, optimizer=optimizer, out=tmp_path / "part", **dict(common, steps=4))
    train(model, data, optimizer=optimizer, out=tmp_path / "part",
          resume=tmp_path / "part" / "checkpoint.npz", **common)
    assert (tmp_path / "part" / "layers.jsonl").read_bytes() == \
        (tmp_path / "whole" / "layers.jsonl").read_bytes()
    assert json.loads((tmp_path / "whole" / "run.json").read_text())["config"]["per_layer"]


def test_fpsim_plot_per_layer_draws_the_same_bytes_and_refuses_what_it_cannot_draw(tmp_path,
                                                                                    capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", "blobs", "--samples", "64", "--hidden", "8", "--steps", "5",
                 "--batch-size", "8", "--per-layer", "--quiet", "--out", str(run)]) == 0
    for suffix in ("png", "svg"):
        assert main(["plot", "--per-layer", str(run), "--out", str(tmp_path / f"a.{suffix}")]) == 0
        assert main(["plot", "--per-layer", str(run), "--out", str(tmp_path / f"b.{suffix}")]) == 0
        assert (tmp_path / f"a.{suffix}").read_bytes() == (tmp_path / f"b.{suffix}").read_bytes()
    capsys.readouterr()
    plain = tmp_path / "plain"
    assert main(["train", "--data", "blobs", "--samples", "64", "--steps", "2", "--quiet",
                 "--out", str(plain)]) == 0
    lines = (run / "layers.jsonl").read_text().splitlines()
    (tmp_path / "bad.jsonl").write_text("\n".join(lines[:2] + [lines[3]]) + "\n")
    for command, words in (([str(plain)], "train the run with --per-layer"),
                           ([str(tmp_path / "bad.jsonl")], "line 3: expected step 1"),
                           ([str(run), str(run)], "--per-layer draws one run")):
        assert main(["plot", "--per-layer", *command, "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "x.png").exists()
