"""One configuration: ``TrainConfig`` checked once; ``fpsim train``'s parser, sweep specs and
``run.json`` all made from it; ``train(config)`` equal to the command line; gradient
accumulation as documented."""
import argparse
import json

import numpy as np
import pytest

from fpsim import backend, nn, use_policy
from fpsim.autograd import Tensor, cross_entropy
from fpsim.cli import main
from fpsim.optim import SGD, Optimizer
from fpsim.scaling import get_scaler
from fpsim.sweep.spec import parse_spec, train_fields
from fpsim.train import TrainConfig, make_dataset, train
from fpsim.train.cli import add_config_options
from fpsim.train.config import OPTIONS, RUN_OPTIONS, check_field, from_options


def test_fields_are_checked_and_normalised_when_built():
    config = TrainConfig(hidden="32, 16", model_args=["width=8", "act=relu"], master="FP32",
                         policy=16)
    assert config.hidden == (32, 16)
    assert config.model_args == {"width": 8, "act": "relu"}
    assert (config.master, config.policy) == ("fp32", "16")
    assert TrainConfig(hidden=config.hidden) == TrainConfig(hidden="32,16")


@pytest.mark.parametrize("changes, error, message", [
    ({"lr": 0.0}, ValueError, r"^lr \(--lr\) must be a number in \(0.0, inf\), got 0.0$"),
    ({"lr": "0.1"}, TypeError, r"^lr \(--lr\) must be a number in \(0.0, inf\), got '0.1'"),
    ({"steps": 2.0}, TypeError, r"^steps \(--steps\) must be a positive integer, got 2.0$"),
    ({"classes": 1}, ValueError, r"^classes \(--classes\) must be an integer >= 2, got 1$"),
    ({"policy": "17-mixed"}, ValueError, r"unknown precision policy '17-mixed'"),
    ({"scaler": "nvidia"}, ValueError, r"^unknown scaler 'nvidia'"),
    ({"model": "resnet"}, ValueError, r"^unknown model 'resnet' for --model; choose mlp"),
    ({"hidden": "8,,8"}, ValueError, r"^hidden \(--hidden\) takes comma-separated"),
    ({"optimizer": "adam", "momentum": 0.9}, ValueError,
     r"^momentum \(--momentum\) is an SGD option; adam has beta1"),
    ({"allow_changes": ["lr"]}, ValueError, r"applies to a resumed run"),
    ({"allow_changes": ["seed"]}, ValueError, r"seed cannot change on resume"),
    ({"accumulate": 0}, ValueError, r"^accumulate \(--accumulate\) must be a positive integer"),
    ({"per_layer": "yes"}, TypeError, r"^per_layer \(--per-layer\) must be True or False"),
    ({"model_args": ["width"]}, ValueError, r"^--model-arg 'width': give KEY=VALUE"),
])
def test_a_bad_field_is_one_sentence_naming_it(changes, error, message):
    with pytest.raises(error, match=message):
        TrainConfig(**changes)


def test_every_field_has_one_check_and_one_option():
    fields = [f for f in TrainConfig.__dataclass_fields__]
    assert list(OPTIONS) == fields
    for name in fields:
        assert check_field(name, getattr(TrainConfig(), name)) == getattr(TrainConfig(), name)
    with pytest.raises(ValueError, match="unknown training option 'speed'"):
        check_field("speed", 1)


def test_the_command_line_is_generated_from_the_config():
    parser = argparse.ArgumentParser()
    add_config_options(parser)
    flags = {a.option_strings[0] for a in parser._actions if a.option_strings} - {"-h"}
    assert flags == {f"--{option.flag}" for option in OPTIONS.values()}
    args = parser.parse_args(["--hidden", "8", "--model-arg", "x=1", "--per-layer"])
    config = TrainConfig(**vars(args))
    assert (config.hidden, config.model_args, config.per_layer) == ((8,), {"x": 1}, True)
    assert TrainConfig(**vars(parser.parse_args([]))) == TrainConfig()


def test_a_sweep_takes_the_run_fields_with_the_configs_checks():
    assert {o.name for o in train_fields().values()} == set(RUN_OPTIONS)
    spec = parse_spec("[base]\nhidden = '8'\n[grid]\nlr = [0.1, 1]\n")
    assert spec.base["hidden"] == "8" and spec.grid["lr"] == [0.1, 1.0]
    with pytest.raises(ValueError, match=r"\[grid\] accumulate: accumulate \(--accumulate\) "
                                         r"must be a positive integer, got 0"):
        parse_spec("[grid]\naccumulate = [1, 0]\n")
    assert from_options({"model-arg": ["a=1"], "batch_size": 8}).model_args == {"a": 1}


def test_train_config_gives_the_command_lines_bits(tmp_path, capsys):
    argv = ["train", "--data", "blobs", "--samples", "128", "--features", "4", "--hidden", "8",
            "--steps", "6", "--batch-size", "16", "--policy", "16-true", "--quiet", "--out",
            str(tmp_path / "cli")]
    assert main(argv) == 0
    config = TrainConfig(data="blobs", samples=128, features=4, hidden="8", steps=6,
                         batch_size=16, policy="16-true", out=tmp_path / "api")
    result = train(config, progress=False)
    from_cli = json.loads((tmp_path / "cli" / "run.json").read_text())
    from_api = json.loads((tmp_path / "api" / "run.json").read_text())
    assert from_api["summary"]["loss_sha256"] == from_cli["summary"]["loss_sha256"] \
        == result.loss_hash
    assert from_api["identity"] == from_cli["identity"]
    with pytest.raises(TypeError, match=r"train\(config\) takes the run from the TrainConfig; "
                                        r"got data, steps besides"):
        train(config, make_dataset("blobs", n=8), steps=3)


def test_run_json_records_what_the_run_used(tmp_path):
    train(TrainConfig(data="tokens", model="transformer", samples=64, classes=8,
                      data_args=["length=4"], steps=2, batch_size=4, accumulate=2,
                      out=tmp_path), progress=False)
    config = json.loads((tmp_path / "run.json").read_text())["config"]
    assert config["data_spec"] == "tokens" and config["data_args"] == {"length": 4}
    assert config["accumulate"] == 2
    assert "hidden" not in config and "activation" not in config    # the transformer's own
    assert config["samples"] == 64


def accumulation_pieces():
    data = make_dataset("teacher", n=64, features=4, classes=3, seed=0)
    with use_policy("16-mixed"):
        model = nn.MLP([4, 8, 3], rng=0)
        optimizer = Optimizer(model, SGD(lr=0.1), master="fp32")
    return data, model, optimizer


def test_accumulation_is_the_documented_sum_of_divided_micro_batches():
    data, model, optimizer = accumulation_pieces()
    result = train(model, data, optimizer=optimizer, policy="16-mixed", scaler="static:1024",
                   steps=3, batch_size=8, accumulate=2, seed=5, progress=False)
    data, twin, twin_optimizer = accumulation_pieces()
    rng, state, losses = backend.host_rng(5), get_scaler("static:1024").init(), []
    for _ in range(3):
        total = 0.0
        for _ in range(2):
            idx = rng.integers(0, len(data), 8)
            with use_policy("16-mixed"):
                loss = cross_entropy(twin(Tensor(data.x[idx])), data.y[idx]) / 2
                loss.backward(np.full(loss.shape, 1024.0, np.float32))
            total += float(loss.item())
        state = twin_optimizer.step(state).scaler_state
        twin_optimizer.zero_grad()
        losses.append(float(np.float32(total)))
    assert [r.loss for r in result.records] == losses
    for (_, mine), (_, theirs) in zip(model.named_parameters(), twin.named_parameters()):
        assert np.array_equal(backend.to_numpy(mine.data), backend.to_numpy(theirs.data))


def schedule_run(out=None, steps=12, resume=None, layout="jsonl", schedule="cosine:t_max=8"):
    data, model, optimizer = accumulation_pieces()
    return train(model, data, optimizer=optimizer, policy="16-mixed", steps=steps,
                 batch_size=8, seed=2, schedule=schedule, out=out, resume=resume,
                 trace_layout=layout, checkpoint_every=5 if out else None, progress=False)


def test_a_schedule_sets_and_records_each_steps_learning_rate(tmp_path):
    from fpsim.optim.schedules import parse_schedule
    from fpsim.train import read_trace
    result = schedule_run(tmp_path / "whole")
    expected = parse_schedule("cosine:t_max=8").lrs(12, 0.1)
    assert [r.lr for r in result.records] == expected
    assert [r.lr for r in read_trace(tmp_path / "whole" / "trace.jsonl")] == expected
    constant = schedule_run(schedule=None)
    assert all(r.lr is None for r in constant.records)
    assert constant.loss_hash != result.loss_hash          # the schedule changed the updates
    csv_run = schedule_run(tmp_path / "csv", layout="csv")
    assert read_trace(tmp_path / "csv" / "trace.csv") == \
        [r._replace(wall_time=w.wall_time) for r, w in
         zip(csv_run.records, read_trace(tmp_path / "csv" / "trace.csv"))]
    info = json.loads((tmp_path / "whole" / "run.json").read_text())
    assert info["config"]["schedule"] == {"schedule": "cosine", "t_max": 8, "eta_min": 0.0}


def test_a_scheduled_run_resumes_with_the_same_bits(tmp_path):
    whole = schedule_run(tmp_path / "whole")
    schedule_run(tmp_path / "part", steps=5)
    resumed = schedule_run(tmp_path / "part", resume=tmp_path / "part" / "checkpoint.npz")
    assert resumed.loss_hash == whole.loss_hash
    assert [r.lr for r in resumed.records] == [r.lr for r in whole.records]
    with pytest.raises(ValueError, match="schedule"):
        schedule_run(tmp_path / "part", resume=tmp_path / "part" / "checkpoint.npz",
                     schedule="step:step_size=2")


def test_the_schedule_flag_and_its_errors(tmp_path, capsys):
    assert main(["train", "--steps", "4", "--quiet", "--schedule", "step:step_size=2",
                 "--out", str(tmp_path / "run")]) == 0
    lines = (tmp_path / "run" / "trace.jsonl").read_text().splitlines()
    lrs = [json.loads(line)["lr"] for line in lines]
    assert lrs == [0.1, 0.1, 0.1 * 0.1, 0.1 * 0.1]       # torch: lr * gamma each 2 steps
    assert main(["train", "--schedule", "cosine:tmax=3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "did you mean 't_max'" in err
    assert not (tmp_path / "bad").exists()


def test_a_trace_whose_steps_carry_a_learning_rate_all_or_none(tmp_path):
    from fpsim.train import TraceError, read_trace
    result = schedule_run(tmp_path / "run", steps=3)
    path = tmp_path / "run" / "trace.jsonl"
    lines = path.read_text().splitlines()
    second = json.loads(lines[1])
    del second["lr"]
    path.write_text("\n".join([lines[0], json.dumps(second), lines[2]]) + "\n")
    with pytest.raises(TraceError, match="line 2: lacks the field 'lr' that the first step has"):
        read_trace(path)
    assert len(result.records) == 3


def test_a_run_is_reproduced_from_its_run_json(tmp_path):
    config = TrainConfig(data="blobs", samples=128, features=4, hidden="8", steps=5,
                         batch_size=16, policy="bf16-mixed", schedule="step:step_size=2",
                         model_args={}, out=tmp_path / "first")
    first = train(config, progress=False)
    again = TrainConfig.from_run(tmp_path / "first")
    assert again == config.replace(out=None)
    assert train(again.replace(out=tmp_path / "again"), progress=False).loss_hash == \
        first.loss_hash
    info = json.loads((tmp_path / "first" / "run.json").read_text())
    info["config"]["train_config"]["lr"] = -1.0
    (tmp_path / "first" / "run.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"run.json: train_config: lr \(--lr\) must be a "
                                         r"number in \(0.0, inf\), got -1.0"):
        TrainConfig.from_run(tmp_path / "first")
    with pytest.raises(ValueError, match="cannot read the run's configuration"):
        TrainConfig.from_run(tmp_path / "nothing")


def test_a_checkpoint_of_fpsim_0_1_resumes_where_it_recorded_unused_sizes():
    """fpsim 0.1 recorded samples, hidden, ... for every run; 0.2 records them where they
    are used: a 0.1 checkpoint of a cnn (hidden recorded, unused) still matches."""
    from fpsim.train.resume import check_same_config
    now = {"policy": "16-mixed", "model_spec": "cnn", "activation": "relu"}
    check_same_config("checkpoint", dict(now, hidden="64,64"), now, frozenset())
    with pytest.raises(ValueError, match="differs in policy"):
        check_same_config("checkpoint", dict(now, policy="16-true"), now, frozenset())
    with pytest.raises(ValueError, match="differs in hidden"):     # used now: compared
        check_same_config("checkpoint", dict(now, hidden="8"), dict(now, hidden="64,64"),
                          frozenset())


def test_the_last_line_names_every_file_written(tmp_path, capsys):
    assert main(["train", "--steps", "2", "--per-layer", "--out", str(tmp_path / "run")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote {tmp_path / 'run'}/run.json, trace.jsonl, checkpoint.npz, layers.jsonl"
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {"run.json", "trace.jsonl",
                                                              "checkpoint.npz", "layers.jsonl"}


def test_a_batch_norm_checkpoint_of_fpsim_0_1_resumes(tmp_path):
    """fpsim 0.1 checkpoints lack BatchNorm's num_batches_tracked (it came in 0.2); it enters
    no computation, so the run resumes with its bits and a note says what was filled in."""
    from fpsim.train import load_checkpoint, save_checkpoint
    data = make_dataset("images", n=64, classes=3, seed=0, size=8)

    def run(steps, **kwargs):
        with use_policy("16-mixed"):
            model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=0), nn.BatchNorm2d(4),
                                  nn.ReLU(), nn.Flatten(), nn.Linear(256, 3, rng=1))
        return train(model, data, policy="16-mixed", steps=steps, batch_size=16,
                     progress=False, **kwargs)

    whole = run(6)
    run(3, out=tmp_path)
    path = tmp_path / "checkpoint.npz"
    arrays, meta = load_checkpoint(path)
    del arrays["param/1.num_batches_tracked"]
    save_checkpoint(path, arrays, meta)
    resumed = run(6, out=tmp_path, resume=path)
    assert resumed.loss_hash == whole.loss_hash
    assert any("holds no BatchNorm num_batches_tracked" in note for note in resumed.notes)
