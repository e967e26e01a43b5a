"""Python API calls with a wrong argument fail at once with one sentence naming the argument,
what it got and what is accepted (TypeError for a wrong type, ValueError for a value of the
right type outside what is accepted), not with an error from deep inside NumPy or Python."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fpsim import Tensor, nn, use_policy
from fpsim.conformance import bursts, clean_runs, random_flags
from fpsim.describe import describe
from fpsim.optim import SGD, Adam, Optimizer
from fpsim.quant import mx_quantize
from fpsim.options import check_instance, check_path, described
from fpsim.sweep import load_spec, parse_spec, run_sweep
from fpsim.train import make_dataset, train


def model_and_optimizer():
    model = nn.Linear(2, 2, rng=0)
    return model, Optimizer(model, SGD(lr=0.1))


@pytest.mark.parametrize("make,kind,message", [
    (lambda: Optimizer(nn.Linear(2, 2), "sgd"), TypeError,
     r"rule must be an update rule such as SGD\(lr=0.1\).*got str 'sgd'"),
    (lambda: Optimizer(nn.Linear(2, 2), SGD), TypeError,
     r"rule must be an update rule .*got the class SGD"),
    (lambda: Optimizer(nn.Linear(2, 2), Adam), TypeError, r"got the class Adam"),
    (lambda: model_and_optimizer()[1].step("abc"), TypeError,
     r"scaler_state must be None or a ScalerState .*got str 'abc'"),
    (lambda: model_and_optimizer()[1].step(per_parameter="yes"), TypeError,
     r"per_parameter must be True or False, got 'yes'"),
    (lambda: Optimizer(nn.Linear(2, 2), SGD(lr=0.1), master="none"), ValueError,
     r"master: unknown format 'none'; accepted names: .*; or None \(not 'none'\) for no "
     r"master copy"),
    (lambda: Optimizer(nn.Linear(2, 2), SGD(lr=0.1), master=32), TypeError,
     r"master must be a format \(a Format or its name\) or None .*got int 32"),
    (lambda: Optimizer(None, SGD(lr=0.1)), TypeError,
     r"params must be a Module, a Tensor or an iterable of Tensors .*got NoneType None"),
    (lambda: Optimizer("weights", SGD(lr=0.1)), TypeError,
     r"params must be a Module.*got str 'weights'"),
    (lambda: Optimizer([("w", Tensor([1.0]), 3)], SGD(lr=0.1)), TypeError,
     r"params\[0\] must be a Tensor or a \(name, Tensor\) pair, got tuple"),
    (lambda: model_and_optimizer()[1].load_state_dict(None), TypeError,
     r"arrays must be a dict of name -> array, as state_dict gives, got NoneType None"),
])
def test_optimizer_arguments(make, kind, message):
    with pytest.raises(kind, match=message):
        make()


def test_a_bad_step_argument_changes_nothing():
    model, optimizer = model_and_optimizer()
    model.weight.grad = Tensor(np.ones((2, 2)))
    before = model.weight.numpy()
    with pytest.raises(TypeError, match="scaler_state"):
        optimizer.step("abc")
    assert optimizer.step_count == 0 and np.array_equal(model.weight.numpy(), before)


@pytest.mark.parametrize("changes,kind,message", [
    (dict(seed=-1), ValueError, r"seed \(--seed\) must be an integer >= 0, got -1"),
    (dict(seed="a"), TypeError, r"seed \(--seed\) must be an integer >= 0, got 'a'"),
    (dict(seed=1.5), TypeError, r"seed \(--seed\) must be an integer >= 0, got 1.5"),
    (dict(model=None), TypeError, r"model must be an fpsim.nn.Module .*got NoneType None"),
    (dict(out=123), TypeError,
     r"out \(--out\) must be a file or folder name \(a str or an os.PathLike\), got int 123"),
    (dict(out=""), ValueError,
     r"out \(--out\) must be a file or folder name, got the empty name ''"),
    (dict(resume=5), TypeError, r"resume \(--resume\) must be a file or folder name .*got int 5"),
    (dict(per_layer="yes"), TypeError,
     r"per_layer \(--per-layer\) must be True or False, got 'yes'"),
    (dict(progress="no"), TypeError, r"progress must be True or False, got 'no'"),
    (dict(trace_layout=5), TypeError,
     r"unknown trace format \(--trace-format\) 5; accepted: jsonl, csv"),
])
def test_train_arguments_are_checked_before_anything_is_written(tmp_path, monkeypatch,
                                                                 changes, kind, message):
    monkeypatch.chdir(tmp_path)            # out="" would have been this folder
    data = make_dataset("blobs", n=16, features=2, classes=2)
    arguments = dict(model=nn.MLP([2, 4, 2], rng=0), data=data, steps=1, batch_size=8,
                     out=tmp_path / "run", progress=False) | changes
    with pytest.raises(kind, match=message):
        train(**arguments)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("make,kind,message", [
    (lambda: nn.Linear(2, 2, rng=-1), ValueError,
     r"rng must be a numpy.random.Generator or an int seed >= 0, got -1"),
    (lambda: nn.Linear(2, 2, rng=1.5), TypeError, r"rng must be .*got float 1.5"),
    (lambda: nn.Embedding(4, 2, rng=True), TypeError, r"rng must be .*got bool True"),
    (lambda: nn.LSTM(2, 2, rng="a"), TypeError, r"rng must be .*got str 'a'"),
    (lambda: nn.MLP(None), TypeError,
     r"MLP sizes must be a list of positive integers such as \[16, 32, 4\], got NoneType None"),
    (lambda: nn.MLP("16,4"), TypeError, r"MLP sizes must be a list .*got str '16,4'"),
    (lambda: nn.Dropout(0.1, seed=-1), ValueError, r"seed must be an integer >= 0, got -1"),
    (lambda: nn.Dropout(0.1, seed=1.5), TypeError, r"seed must be an integer >= 0, got 1.5"),
    (lambda: nn.MultiheadAttention(4, 2, seed=2 ** 64), ValueError,
     r"seed must be an integer in \[0, 2\*\*64\), got 18446744073709551616"),
    (lambda: nn.Linear(2, 2).load_state_dict(None), TypeError,
     r"state must be a dict of name -> array, as state_dict gives, got NoneType None"),
    (lambda: Tensor([[1.0, 2.0], [3.0]]), ValueError,
     r"Tensor data must be real numbers in a rectangular array \(nested lists of equal "
     r"lengths\), got list \[\[1.0, 2.0\], \[3.0\]\]"),
])
def test_layer_and_tensor_arguments(make, kind, message):
    with pytest.raises(kind, match=message):
        make()


def test_integer_seeds_and_generators_still_make_the_same_weights():
    by_seed = nn.Linear(3, 2, rng=np.int64(7)).weight.data
    by_generator = nn.Linear(3, 2, rng=np.random.default_rng(7)).weight.data
    assert np.array_equal(by_seed, by_generator)
    assert nn.Dropout(0.5, seed=np.int64(3)).seed == 3
    with use_policy("16-mixed"):
        assert [p.shape for p in nn.MLP((2, 3, 1), rng=0).parameters()] == [(3, 2), (3,),
                                                                            (1, 3), (1,)]


SPEC = '[base]\ndata = "blobs"\nsamples = 16\nhidden = "4"\nsteps = 1\n[grid]\nseed = [0]\n'


@pytest.mark.parametrize("make,kind,message", [
    (lambda tmp: load_spec(None), TypeError,
     r"path must be a file or folder name \(a str or an os.PathLike\), got NoneType None"),
    (lambda tmp: parse_spec(SPEC.encode()), TypeError,
     r"text must be the sweep's TOML as a str .*got bytes b'\[base\]"),
    (lambda tmp: run_sweep({"grid": {"seed": [0]}}, tmp / "out"), TypeError,
     r"spec must be a SweepSpec \(load_spec\(path\) reads one.*got dict \{'grid'"),
    (lambda tmp: run_sweep("sweeps/loss_scale.toml", tmp / "out"), TypeError,
     r"spec must be a SweepSpec .*got str 'sweeps/loss_scale.toml'"),
    (lambda tmp: run_sweep(parse_spec(SPEC), None), TypeError,
     r"out must be a file or folder name .*got NoneType None"),
])
def test_sweep_arguments(tmp_path, make, kind, message):
    with pytest.raises(kind, match=message):
        make(tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value,kind,message", [
    (np.float32([1.0, 2.0]), TypeError,
     r"value must be one real number \(a Python or NumPy scalar; inf and nan too\), got "
     r"ndarray array\(\[1., 2.\], dtype=float32\)"),
    ("0.1", TypeError, r"value must be one real number .*got str '0.1'"),
    (True, TypeError, r"value must be one real number .*got bool True"),
    (10 ** 400, ValueError, r"value must be within float64's range .*got int 1000"),
])
def test_describe_takes_one_real_number(value, kind, message):
    with pytest.raises(kind, match=message):
        describe(value, "fp16")


def test_describe_still_takes_scalars_of_every_kind():
    assert describe(np.float32(1.5), "fp16").value == 1.5
    assert describe(3, "fp16").value == 3.0
    assert describe(float("-inf"), "fp16").kind == "inf"


def test_option_helpers():
    assert check_instance("x", 3, int, "an int") == 3
    with pytest.raises(TypeError, match="x must be an int, got bool True"):
        check_instance("x", True, int, "an int")
    assert check_instance("flag", True, bool, "a bool") is True
    assert check_path("out", "a/b").name == "b"
    with pytest.raises(ValueError, match="out must be a file or folder name, got the empty"):
        check_path("out", "  ")
    assert described("x" * 100).endswith("...") and len(described("x" * 100)) == 64


@pytest.mark.parametrize("make,kind,message", [
    (lambda: random_flags(2.5, 0.1), TypeError, r"^n must be an integer >= 0, got 2.5$"),
    (lambda: random_flags(-1, 0.1), ValueError, r"^n must be an integer >= 0, got -1$"),
    (lambda: clean_runs(True), TypeError,
     r"^growth_interval must be a positive integer, got True$"),
    (lambda: bursts(8, 1, 0), ValueError, r"^max_length must be a positive integer, got 0$"),
    (lambda: mx_quantize(np.zeros(32, np.float32), "e4m3fn", block=32.0), TypeError,
     r"^mx_quantize: block must be a positive integer, got 32.0$"),
])
def test_counts_are_checked_with_the_shared_vocabulary(make, kind, message):
    with pytest.raises(kind, match=message):
        make()


@pytest.mark.parametrize("op,axis,message", [
    ("sum", "a", r"^sum: axis must be None, an int or a tuple of ints, got str 'a'$"),
    ("mean", 1.5, r"^mean: axis must be None, an int or a tuple of ints, got float 1.5$"),
    ("sum", (0, True), r"^sum: axis must be None, an int or a tuple of ints, got bool True$"),
    ("max", (0, 1), r"^max: axis must be None or one int axis, got tuple \(0, 1\)$"),
    # one axis: a tuple is refused, not cut to its first axis
    ("softmax", (0, 1), r"^softmax: axis must be one int axis, got tuple \(0, 1\)$"),
    ("log_softmax", None, r"^log_softmax: axis must be one int axis, got NoneType None$"),
])
def test_reduction_axes_of_the_wrong_type_are_type_errors(op, axis, message):
    from fpsim import autograd
    with pytest.raises(TypeError, match=message):
        getattr(autograd, op)(Tensor(np.ones((2, 3), np.float32)), axis)
    assert getattr(autograd, op)(Tensor(np.ones((2, 3), np.float32)), np.int64(1)).shape[0] == 2


def test_a_backend_name_of_the_wrong_type_is_a_type_error():
    from fpsim import backend
    before = backend.name()
    with pytest.raises(TypeError, match=r"^unknown backend 5; accepted: numpy, "):
        backend.set_backend(5)
    with pytest.raises(TypeError, match=r"^backend name must be a non-empty string, got "
                                        r"NoneType None$"):
        backend.register_backend(None, object)
    with pytest.raises(ValueError, match=r"^backend name must be a non-empty string, got ''$"):
        backend.register_backend("", object)
    assert backend.name() == before and "" not in backend.available()
