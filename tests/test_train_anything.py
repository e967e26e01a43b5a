"""train() on any model, loss and data shape (issue 26): images through a CNN, token sequences
with per-token labels, regression targets, a loss function of the user's; checked against the
same loss computed by hand, resumed exactly, and bad combinations refused before anything is
written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fpsim import nn, use_policy
from fpsim.autograd import Tensor, cross_entropy, mean, mse_loss
from fpsim.train import Dataset, resolve_loss, train


def images(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    return Dataset(x, (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64), 2, "images")


def cnn(seed=0):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=seed), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64, 2, rng=seed + 1))


class TokenModel(nn.Module):
    """Embedding then a per-position linear read-out: logits (batch, length, vocab)."""

    def __init__(self, vocab=10, dim=8, seed=0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, rng=seed)
        self.out = nn.Linear(dim, vocab, rng=seed + 1)

    def forward(self, ids):
        return self.out(self.embed(ids))


def tokens(n=40, length=6, vocab=10, seed=0):
    x = np.random.default_rng(seed).integers(0, vocab, (n, length))
    return Dataset(x, (x + 1) % vocab, vocab, "tokens")


def regression(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    return Dataset(x, (x @ rng.standard_normal((5, 2))).astype(np.float32), None, "regression")


def batch_of_first_step(data, batch_size, seed=0):
    return np.random.default_rng(seed).integers(0, len(data), batch_size)   # train()'s draw


def test_a_cnn_on_images_trains_reproducibly_under_16_mixed(tmp_path):
    runs = [train(cnn(), images(), steps=6, batch_size=16, policy="16-mixed", progress=False,
                  out=tmp_path / name) for name in ("a", "b")]
    assert runs[0].loss_hash == runs[1].loss_hash and np.isfinite(runs[0].losses).all()
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["config"]["loss"] == "cross_entropy" and info["config"]["model"] == "Sequential"


def test_a_cnn_run_resumes_with_the_bits_of_the_uninterrupted_one(tmp_path):
    whole = train(cnn(), images(), steps=6, batch_size=16, progress=False)
    model = cnn()
    train(model, images(), steps=3, batch_size=16, progress=False, out=tmp_path)
    resumed = train(model, images(), steps=6, batch_size=16, progress=False, out=tmp_path,
                    resume=tmp_path / "checkpoint.npz")
    assert resumed.loss_hash == whole.loss_hash


def test_per_token_labels_give_the_mean_cross_entropy_over_every_position():
    data, model = tokens(), TokenModel()
    first = train(TokenModel(), data, steps=1, batch_size=8, policy="32-true",
                  progress=False).losses[0]
    idx = batch_of_first_step(data, 8)
    with use_policy("32-true"):
        logits = model(data.x[idx])
        expected = cross_entropy(logits.reshape(-1, 10), data.y[idx].reshape(-1)).item()
    assert first == np.float32(expected)


def test_regression_targets_default_to_mean_squared_error():
    data = regression()
    assert resolve_loss("auto", data)[1] == "mse"
    first = train(nn.MLP([5, 16, 2], rng=0), data, steps=1, batch_size=8, policy="32-true",
                  progress=False).losses[0]
    idx = batch_of_first_step(data, 8)
    with use_policy("32-true"):
        expected = mse_loss(nn.MLP([5, 16, 2], rng=0)(Tensor(data.x[idx])),
                            Tensor(data.y[idx])).item()
    assert first == np.float32(expected)


def squared_output(output, targets):
    return mean(output * output)


def test_a_loss_function_of_the_users_is_used_and_named(tmp_path):
    result = train(nn.MLP([5, 4, 2], rng=0), regression(), steps=3, batch_size=8,
                   loss=squared_output, progress=False, out=tmp_path)
    assert len(result.losses) == 3 and np.isfinite(result.losses).all()
    recorded = json.loads((tmp_path / "run.json").read_text())["config"]["loss"]
    assert recorded == f"{__name__}:squared_output"


@pytest.mark.parametrize("data,loss,message", [
    (regression(), "cross_entropy", "cross_entropy needs integer labels"),
    (tokens(), "mse", "mse needs float targets"),
    (regression(), "hinge", "unknown loss 'hinge'"),
    (regression(), lambda out, t: out, "the loss must give one number"),
    (images(), "auto", r"output \(4,\) must be the labels. shape \(2,\) plus a class axis"),
])
def test_a_loss_that_does_not_fit_is_refused_before_anything_is_written(data, loss, message,
                                                                        tmp_path):
    model = nn.MLP([5, 4, 2], rng=0) if data.name == "regression" else TokenModel()
    if data.name == "images":
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 2, rng=0), nn.Flatten(0))
    with pytest.raises((ValueError, TypeError), match=message):
        train(model, data, steps=2, batch_size=4, loss=loss, progress=False,
              out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("make,message", [
    (lambda: Dataset(np.array([[1, -2]]), np.array([0]), 2), "token ids and must be >= 0"),
    (lambda: Dataset(np.zeros((2, 3), np.float32), np.array([[0.0], [np.nan]]), None),
     r"targets hold 1 NaN/inf value\(s\).*sample 1, feature 0"),
    (lambda: Dataset(np.zeros((2, 3), np.float32), np.array([0, 1]), None),
     "must be floating point"),
    (lambda: Dataset(np.zeros((2, 3, 4), np.float32), np.array([0, 1, 1]), 2),
     r"shape \(2,\) or \(2, \.\.\.\)"),
    (lambda: Dataset(np.full((1, 2, 2), np.inf, np.float32), np.array([0]), 2),
     r"sample 0, position \(0, 0\)"),
])
def test_datasets_of_any_shape_are_checked(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def dropout_bn_cnn(seed=0):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=seed), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Dropout(0.25, seed=seed), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64, 2, rng=seed + 1))


def test_dropout_and_batch_norm_resume_exactly_and_the_dry_run_leaves_them_alone(tmp_path):
    """The checkpoint holds BatchNorm's running statistics (buffers) and Dropout's Philox
    offset (extra state); the check before training runs in eval mode, so neither moves."""
    whole_model = dropout_bn_cnn()
    whole = train(whole_model, images(), steps=6, batch_size=16, progress=False)
    assert whole_model[3].offset == 6 * 16 * 4 * 8 * 8 and whole_model.training
    model = dropout_bn_cnn()
    train(model, images(), steps=3, batch_size=16, progress=False, out=tmp_path)
    model = dropout_bn_cnn()               # a fresh process: offsets and statistics from disk
    resumed = train(model, images(), steps=6, batch_size=16, progress=False, out=tmp_path,
                    resume=tmp_path / "checkpoint.npz")
    assert resumed.loss_hash == whole.loss_hash and model[3].offset == whole_model[3].offset
    assert (model.state_dict()["1.running_var"] == whole_model.state_dict()["1.running_var"]).all()
    from fpsim.train import load_checkpoint, save_checkpoint
    arrays, meta = load_checkpoint(tmp_path / "checkpoint.npz")
    for extra, words in (({"3": {"offset": -1}}, "module '3': Dropout's extra state"),
                         ({}, r"extra state for modules \[\]")):
        save_checkpoint(tmp_path / "bad.npz", arrays, dict(meta, modules=extra))
        with pytest.raises(ValueError, match=words):
            train(dropout_bn_cnn(), images(), steps=8, batch_size=16, progress=False,
                  resume=tmp_path / "bad.npz")
