"""Issue 40, silent accepts in data, layers and checkpoints: each is refused with one sentence
that names what was wrong, before anything is written or changed (from the CLI: one line,
exit status 2)."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from fpsim import nn, use_policy
from fpsim.cli import main
from fpsim.optim import SGD, Optimizer
from fpsim.train import (CheckpointError, Dataset, load_checkpoint, make_dataset,
                         save_checkpoint, train)


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fpsim: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def blobs(n=64):
    return make_dataset("blobs", n=n, features=4, classes=3, seed=0)


def small_model(policy="16-mixed"):
    with use_policy(policy):
        return nn.MLP([4, 8, 3], rng=0)


def run(data, out=None, *, model=None, policy="16-mixed", steps=2, batch_size=8, **kwargs):
    model = small_model(policy) if model is None else model
    return train(model, data, policy=policy, steps=steps, batch_size=batch_size, out=out,
                 progress=False, **kwargs)


# --- 1. a Dataset's arrays written into after it was built ---------------------------------
@pytest.mark.parametrize("spoil,words", [
    (lambda d: d.x.__setitem__((5, 2), np.nan), "inputs hold 1 NaN/inf value(s), the first at "
                                                "sample 5, feature 2"),
    (lambda d: d.x.__setitem__((0, 0), -np.inf), "inputs hold 1 NaN/inf value(s)"),
    (lambda d: d.y.__setitem__(3, 7), "labels must lie in 0..2, got 0..7"),
])
def test_values_written_into_a_dataset_after_it_was_built_are_refused(tmp_path, spoil, words):
    data = blobs()
    spoil(data)
    out = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        run(data, out)
    assert words in str(err.value) and "after it was built" in str(err.value)
    assert not out.exists()


def test_a_nan_target_written_into_regression_data_is_refused():
    data = Dataset(np.ones((16, 4), np.float32), np.zeros((16, 3), np.float32), None, "reg")
    data.y[2, 1] = np.inf
    with pytest.raises(ValueError, match="reg: targets hold 1 NaN/inf value"):
        run(data)


DATA_FACTORY = '''
import numpy as np
from fpsim.train import make_dataset

def spoiled(seed=0):
    data = make_dataset("blobs", n=64, features=4, classes=3, seed=seed)
    data.x[1, 3] = np.nan                    # after the Dataset checked it
    return data
'''


def test_a_data_factory_that_writes_nan_after_building_is_one_line(tmp_path, monkeypatch,
                                                                   capsys):
    (tmp_path / "spoiling_data.py").write_text(textwrap.dedent(DATA_FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", "--data", "spoiling_data:spoiled", "--steps", "2", "--batch-size",
                 "8", "--quiet", "--out", str(out)]) == 2
    assert "the first at sample 1, feature 3" in one_error_line(capsys)
    assert not out.exists()


# --- 2. normalisation layers: eps, momentum, a loaded running variance -----------------------
@pytest.mark.parametrize("make,words", [
    (lambda: nn.BatchNorm2d(2, eps=-1), "eps must be a number > 0, got -1"),
    (lambda: nn.BatchNorm2d(2, eps=0.0), "eps must be a number > 0, got 0.0"),
    (lambda: nn.BatchNorm2d(2, eps=float("inf")), "eps must be finite"),
    (lambda: nn.BatchNorm2d(2, momentum=2), "momentum must be a number in [0, 1], got 2"),
    (lambda: nn.BatchNorm2d(2, momentum=-1), "momentum must be a number in [0, 1], got -1"),
    (lambda: nn.BatchNorm2d(2, momentum=float("nan")), "momentum must be finite"),
    (lambda: nn.LayerNorm(4, eps=-1e-5), "eps must be a number > 0, got -1e-05"),
    (lambda: nn.LayerNorm(4, eps=0), "eps must be a number > 0, got 0"),
    (lambda: nn.TransformerBlock(8, 2, layer_norm_eps=-1.0, rng=0),
     "eps must be a number > 0"),
])
def test_norm_layers_refuse_eps_and_momentum_out_of_range(make, words):
    with pytest.raises(ValueError) as err:
        make()
    assert words in str(err.value)


def test_norm_layers_accept_momentum_zero_and_one():
    assert [nn.BatchNorm2d(2, momentum=m).momentum for m in (0, 1, 0.5)] == [0.0, 1.0, 0.5]


def test_a_negative_running_variance_does_not_load():
    model = nn.Sequential(nn.Conv2d(1, 2, 3, rng=0), nn.BatchNorm2d(2))
    before = model.state_dict()
    state = dict(before, **{"1.running_var": np.float32([1.0, -0.5])})
    with pytest.raises(ValueError, match=r"'1.running_var': running_var is a variance and must "
                                         r"be >= 0, got -0.5"):
        model.load_state_dict(state)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())
    model.load_state_dict(dict(before, **{"1.running_var": np.float32([0.0, 2.0])}))


# --- 3. load_state_dict with NaN/inf -----------------------------------------------------------
@pytest.mark.parametrize("value,words", [
    (np.nan, "'2.weight' holds 1 NaN/inf value(s); parameters and buffers must be finite"),
    (-np.inf, "'2.weight' holds 1 NaN/inf value(s)"),
    (1e6, "'2.weight' holds 1 value(s) beyond the range of fp16"),
])
def test_load_state_dict_refuses_values_that_are_not_finite_by_name(value, words):
    model = small_model("16-true")
    before = model.state_dict()
    state = {k: v.copy() for k, v in before.items()}
    state["0.weight"] += np.float32(0.25)      # a valid change first: it must not be applied
    state["2.weight"][1, 0] = value
    with pytest.raises(ValueError) as err:
        model.load_state_dict(state)
    assert words in str(err.value)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())


# --- 4. a checkpoint whose master copies are NaN or are not the weights' source ---------------
def checkpointed_run(out, steps=4, **kwargs):
    with use_policy("16-mixed"):
        model = nn.MLP([4, 8, 3], rng=0)
        optimizer = Optimizer(model, SGD(lr=0.1), master="fp32")
    return train(model, blobs(), optimizer=optimizer, policy="16-mixed", scaler=None,
                 steps=steps, batch_size=8, out=out, progress=False, **kwargs)


def edit_checkpoint(path, edit):
    arrays, meta = load_checkpoint(path)
    edit(arrays)
    save_checkpoint(path, arrays, meta)


def spoil_master(arrays):
    arrays["optim/master/0.bias"][3] = np.nan


def move_weight(arrays):
    arrays["param/2.weight"][0, 1] = np.nextafter(arrays["param/2.weight"][0, 1], np.inf)
    arrays["optim/master/2.weight"][0, 0] += np.float32(0.5)


def nan_weight(arrays):
    arrays["param/0.weight"][0, 0] = np.nan


@pytest.mark.parametrize("edit,words", [
    (spoil_master, "the master copy of '0.bias' holds 1 NaN/inf value(s)"),
    (move_weight, "parameter '2.weight' is not its master copy rounded to fp32 (2 of its 24 "
                  "values differ)"),
    (nan_weight, "parameter '0.weight' holds 1 NaN/inf value(s)"),
])
def test_a_checkpoint_whose_weights_and_masters_disagree_is_refused(tmp_path, capsys, edit,
                                                                     words):
    out = tmp_path / "run"
    checkpointed_run(out)
    edit_checkpoint(out / "checkpoint.npz", edit)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(CheckpointError) as err:
        checkpointed_run(out, resume=out / "checkpoint.npz", steps=6)
    assert words in str(err.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_cli_refuses_a_nan_master_copy_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    small = ["train", "--samples", "64", "--features", "4", "--hidden", "8", "--batch-size",
             "8", "--quiet", "--out", str(out)]
    assert main([*small, "--steps", "2"]) == 0
    edit_checkpoint(out / "checkpoint.npz", spoil_master)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*small, "--steps", "4", "--resume", str(out / "checkpoint.npz")]) == 2
    assert "the master copy of '0.bias' holds 1 NaN/inf value(s)" in one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# --- 5. a batch larger than the data ---------------------------------------------------------
def test_a_batch_larger_than_the_data_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="batch_size must be at most the 64 samples of data "
                                         "'blobs' .*, got 65"):
        run(blobs(64), tmp_path / "python", batch_size=65)
    assert not (tmp_path / "python").exists()
    assert len(run(blobs(64), batch_size=64).records) == 2      # all of them is a batch
    out = tmp_path / "cli"
    assert main(["train", "--samples", "128", "--batch-size", "100000", "--steps", "2",
                 "--quiet", "--out", str(out)]) == 2
    assert ("--batch-size must be at most the 128 samples of the data (batches are drawn from "
            "them with replacement), got 100000") in one_error_line(capsys)
    assert not out.exists()


# --- 6. and 7. classes and token ids ------------------------------------------------------
@pytest.mark.parametrize("classes,error", [(1, ValueError), (0, ValueError), (2.0, TypeError),
                                           (True, TypeError)])
def test_a_classification_needs_two_classes(classes, error):
    with pytest.raises(error) as err:
        Dataset(np.zeros((4, 2), np.float32), np.zeros(4, np.int64), classes)
    assert (f"data: classes must be an integer >= 2, got {classes!r} (a classification needs "
            f"two classes or more") in str(err.value)


def test_uint64_token_ids_beyond_int64_are_refused_not_wrapped():
    ids = np.array([[1, 2], [3, 2 ** 63 + 5]], np.uint64)
    with pytest.raises(ValueError) as err:
        Dataset(ids, np.zeros((2, 2), np.int64), 3)
    assert ("token ids and must fit int64 (at most 2**63 - 1); 1 value(s) are larger, the "
            "first at sample 1, feature 1") in str(err.value)
    largest = Dataset(np.array([[2 ** 63 - 1]], np.uint64), np.zeros(1, np.int64), 3)
    assert int(largest.x[0, 0]) == 2 ** 63 - 1


# --- 8. a model built in one parameter format, trained under a policy of another ------------
@pytest.mark.parametrize("built,trained,words", [
    ("16-true", "32-true", "model parameter '0.weight' is stored in fp16 but policy 32-true "
                           "keeps parameters in fp32"),
    ("32-true", "bf16-true", "is stored in fp32 but policy bf16-true keeps parameters in bf16"),
    ("16-true", "16-mixed", "build the model under use_policy('16-mixed')"),
])
def test_a_model_in_another_parameter_format_than_the_policy_is_refused(tmp_path, built,
                                                                        trained, words):
    out = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        run(blobs(), out, model=small_model(built), policy=trained)
    assert words in str(err.value)
    assert not out.exists()


def test_a_model_built_outside_any_policy_is_not_trained_as_16_true(tmp_path):
    """Issue 43's silent case: a model built without use_policy keeps fp32 weights; training
    it with policy="16-true" would label fp32 weights a 16-true run. It is refused, saying how
    to build it."""
    model = nn.MLP([4, 8, 3], rng=0)
    with pytest.raises(ValueError, match=r"is stored in fp32 but policy 16-true keeps "
                                         r"parameters in fp16; build the model under "
                                         r"use_policy\('16-true'\)"):
        run(blobs(), tmp_path / "run", model=model, policy="16-true")
    assert not (tmp_path / "run").exists()
