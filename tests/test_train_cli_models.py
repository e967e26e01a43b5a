"""`fpsim train --model/--data` (issue 26): the built-in cnn on the built-in images, a user's
own model and data through MODULE:FACTORY with --model-arg/--data-arg, recorded in run.json,
the same bits as the same model trained from Python; every way a factory fails is one line,
exit status 2, nothing written; sweeps take the same fields."""
from __future__ import annotations

import json
import textwrap

import pytest

from fpsim.cli import main
from fpsim.sweep import parse_spec
from fpsim.train import make_dataset, train

USER_MODULE = '''
import numpy as np
from fpsim import nn
from fpsim.train import Dataset

def small_cnn(width=4, seed=0):
    return nn.Sequential(nn.Conv2d(1, width, 3, padding=1, rng=seed), nn.ReLU(),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(width * 16, 3, rng=seed + 1))

def stripes(n=96, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.standard_normal((n, 1, 8, 8)) * 0.5
    x[np.arange(n), 0, 2 * y, :] += 2.0          # a bright row whose place is the class
    return Dataset(x.astype(np.float32), y, 3, "stripes")

def broken(seed=0):
    raise RuntimeError("no such weights file: w.npz")

def not_a_model(seed=0):
    return [1, 2]

NOT_CALLABLE = 3

def mean_squared_logit(output, labels):
    from fpsim.autograd import cross_entropy
    return cross_entropy(output, labels) * 2.0
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_models"


COMMON = ["train", "--steps", "6", "--batch-size", "16", "--quiet", "--policy", "16-mixed"]


def test_the_built_in_cnn_learns_the_built_in_images(tmp_path):
    out = tmp_path / "run"
    assert main([*COMMON, "--model", "cnn", "--data", "images", "--data-arg", "size=8",
                 "--classes", "3", "--samples", "256", "--out", str(out)]) == 0
    config = json.loads((out / "run.json").read_text())["config"]
    assert (config["model_spec"], config["data"], config["data_args"]) == ("cnn", "images",
                                                                            {"size": 8})
    assert config["model"] == "Sequential" and config["loss"] == "cross_entropy"


def test_a_users_model_and_data_from_factories_match_python(user_module, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*COMMON, "--model", f"{user_module}:small_cnn", "--model-arg", "width=2",
                 "--data", f"{user_module}:stripes", "--data-arg", "n=64", "--seed", "3",
                 "--out", str(out)]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["model_args"] == {"width": 2} and \
        info["config"]["data_args"] == {"n": 64}
    import my_models
    from fpsim import use_policy
    with use_policy("16-mixed"):
        model = my_models.small_cnn(width=2, seed=3)        # --seed reaches the factories
    expected = train(model, my_models.stripes(n=64, seed=3), steps=6, batch_size=16, seed=3,
                     policy="16-mixed", progress=False)
    assert info["summary"]["loss_sha256"] == expected.loss_hash


def test_factories_import_from_the_current_folder_and_the_loss_may_be_one(tmp_path, capsys,
                                                                        monkeypatch):
    (tmp_path / "mylm.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    out = tmp_path / "run"
    assert main([*COMMON, "--model", "mylm:small_cnn", "--data", "mylm:stripes",
                 "--loss", "mylm:mean_squared_logit", "--out", str(out)]) == 0
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["loss"] == "mylm:mean_squared_logit"
    assert config["data_spec"] == "mylm:stripes" and config["model_spec"] == "mylm:small_cnn"
    for unused in ("samples", "features", "classes", "hidden", "activation"):
        assert unused not in config          # the factories do not take them
    assert main([*COMMON, "--loss", "mylm:NOT_CALLABLE"]) == 2
    assert "--loss mylm:NOT_CALLABLE: 'NOT_CALLABLE' is a int" in capsys.readouterr().err


@pytest.mark.parametrize("option,factory,message", [
    ("--model", "my_models:broken", "--model my_models:broken raised RuntimeError: no such "
                                    "weights file: w.npz"),
    ("--model", "my_models:not_a_model", "returned list, not an fpsim.nn.Module"),
    ("--model", "my_models:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a callable"),
    ("--model", "my_models:missing", "module 'my_models' has no 'missing'"),
    ("--model", "no_such_module:f", "cannot import module 'no_such_module' "
                                    "(ModuleNotFoundError"),
    ("--model", "my_models", "unknown model 'my_models'"),
    ("--data", "my_models:small_cnn", "returned Sequential, not an fpsim.train.Dataset"),
    ("--model-arg", "width", "--model-arg 'width': give KEY=VALUE"),
    ("--data-arg", "size=0", "size must be an integer >= 1, got 0"),
    ("--data-arg", "colour=1", "data set 'images' takes size, channels, noise; got 'colour'"),
])
def test_a_factory_that_fails_is_one_line_and_nothing_is_written(user_module, tmp_path, capsys,
                                                                 option, factory, message):
    command = [*COMMON, "--model", "cnn", "--data", "images", "--out", str(tmp_path / "run")]
    command += [option, factory]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_the_built_in_transformer_on_tokens_is_the_python_model(tmp_path):
    out = tmp_path / "run"
    assert main([*COMMON, "--model", "transformer", "--model-arg", "d_model=8",
                 "--model-arg", "heads=2", "--model-arg", "blocks=1", "--data", "tokens",
                 "--data-arg", "length=5", "--classes", "7", "--samples", "64",
                 "--out", str(out)]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["model"] == "TokenTransformer" and info["config"]["loss"] == \
        "cross_entropy"
    from fpsim import use_policy
    from fpsim.train.models import TokenTransformer
    with use_policy("16-mixed"):
        model = TokenTransformer(7, 7, 5, d_model=8, heads=2, blocks=1, seed=0)
    expected = train(model, make_dataset("tokens", 64, classes=7, seed=0, length=5), steps=6,
                     batch_size=16, policy="16-mixed", progress=False)
    assert info["summary"]["loss_sha256"] == expected.loss_hash


def test_the_mlp_refuses_images_and_says_what_fits(capsys):
    assert main([*COMMON, "--data", "images"]) == 2
    assert "--model mlp takes feature rows" in capsys.readouterr().err


def test_tokens_are_sequences_with_a_label_per_token():
    data = make_dataset("tokens", 50, classes=7, seed=1, length=5)
    assert data.x.shape == (50, 5) and data.x.dtype.kind == "i" and data.y.shape == (50, 5)
    assert ((data.x[:, 1:] + data.x[:, :-1]) % 7 == data.y[:, 1:]).all()


def test_a_sweep_takes_model_data_and_their_arguments():
    spec = parse_spec('[base]\nmodel = "cnn"\ndata = "images"\ndata_arg = ["size=8"]\n'
                      '[grid]\nmodel_arg = [["channels=[4]"], ["channels=[4, 8]"]]\n')
    assert spec.grid["model_arg"] == [["channels=[4]"], ["channels=[4, 8]"]]
    for bad, words in (('model = "resnet"', "unknown model 'resnet'"),
                       ('data_arg = "size=8"', "must be a list of strings"),
                       ('model_arg = ["8"]', "give KEY=VALUE")):
        with pytest.raises(ValueError, match=words):
            parse_spec(f"[base]\n{bad}\n[grid]\nseed = [0, 1]\n")
