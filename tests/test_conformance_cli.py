"""fpsim check-scaler: exit 0 on agreement, 1 with the first divergence, 2 on bad input."""
import argparse
import json

import pytest

from fpsim.conformance import TraceStep, write_trace
from fpsim.conformance.cli import COMMANDS, UsageError, main, parse_param, register, run
from fpsim.scaling import preset


def write_preset_trace(path, name, flags, **params):
    state, steps = preset(name, **params).init(), []
    for i, flag in enumerate(flags):
        after = state.update(flag)
        steps.append(TraceStep(i, flag, state.scale, after.scale, after.skipped,
                               growth_tracker=after.growth_tracker,
                               hysteresis=after.hysteresis_left))
        state = after
    write_trace(path, steps, source=f"fpsim preset {name}", params=params)
    return path


FLAGS = [False] * 7 + [True, True] + [False] * 9 + [True]


def test_agree_and_diverge(tmp_path, capsys):
    path = write_preset_trace(tmp_path / "m.jsonl", "megatron", FLAGS, growth_interval=3)
    assert main(["check-scaler", str(path), "--preset", "megatron"]) == 0
    assert capsys.readouterr().out.startswith("agree: 19 of 19 steps match preset megatron")
    assert main(["check-scaler", str(path), "--preset", "deepspeed"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("DIVERGED at step 0 (trace line 2)")
    assert "recorded:  fpsim preset megatron" in out and "hysteresis" in out
    # without the header's growth_interval=3 the default 1000 differs at the first growth
    assert main(["check-scaler", str(path), "--preset", "megatron",
                 "--ignore-header-params"]) == 1
    assert "DIVERGED at step 2 (trace line 4)" in capsys.readouterr().out
    assert main(["check-scaler", str(path), "--preset", "megatron",
                 "--param", "hysteresis=1"]) == 1
    out = capsys.readouterr().out                 # the recorded hysteresis counter is 2
    assert out.startswith("DIVERGED at step 0 (trace line 2)")
    assert [line.split()[:3] + line.split()[-2:] for line in out.splitlines()
            if line.strip().startswith("hysteresis")] == [["hysteresis", "2", "1", "<-",
                                                            "differs"]]


def test_param_overrides_rescue_a_trace_without_header_params(tmp_path, capsys):
    state, steps = preset("torch", init_scale=1024.0, growth_interval=2).init(), []
    for i, flag in enumerate(FLAGS):
        after = state.update(flag)
        steps.append(TraceStep(i, flag, state.scale, after.scale, after.skipped))
        state = after
    write_trace(tmp_path / "t.jsonl", steps)
    base = ["check-scaler", str(tmp_path / "t.jsonl"), "--preset", "torch"]
    assert main(base) == 1
    assert main(base + ["--param", "init_scale=2**10", "--param", "growth_interval=2"]) == 0
    assert main(base + ["--param", "init_scale=0x1p10", "--param", "growth_interval=2"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("text,expected", [
    ("growth_interval=100", ("growth_interval", 100)),
    ("init_scale=2**16", ("init_scale", 65536.0)),
    ("init_scale=2^-3", ("init_scale", 0.125)),
    ("backoff_factor=0x1p-1", ("backoff_factor", 0.5)),
    ("min_scale=none", ("min_scale", None)),
    ("max_scale=16777216", ("max_scale", 16777216.0)),
    ("finite_guard=false", ("finite_guard", False)),
    ("tracker_wraps=true", ("tracker_wraps", True)),
    ("precision=float32", ("precision", "float32")),
    (" hysteresis = 2 ", ("hysteresis", 2)),
])
def test_parse_param(text, expected):
    assert parse_param(text) == expected


@pytest.mark.parametrize("text,words", [
    ("growth_interval", "KEY=VALUE"), ("speed=3", "unknown parameter 'speed'"),
    ("growth_interval=1.5", "integer"), ("finite_guard=maybe", "true or false"),
    ("init_scale=big", "number"), ("name=x", "unknown parameter"),
])
def test_parse_param_errors(text, words):
    with pytest.raises(UsageError, match=words):
        parse_param(text)


def test_bad_input_exits_2_with_a_reason(tmp_path, capsys):
    good = write_preset_trace(tmp_path / "g.jsonl", "torch", FLAGS)
    bad = tmp_path / "bad.jsonl"
    lines = good.read_text().splitlines()
    row = json.loads(lines[3])
    row["found_inf"] = "no"
    lines[3] = json.dumps(row)
    bad.write_text("\n".join(lines) + "\n")
    cases = [
        (["check-scaler", str(tmp_path / "none.jsonl"), "--preset", "torch"], "does not exist"),
        (["check-scaler", str(bad), "--preset", "torch"], "line 4, field 'found_inf'"),
        (["check-scaler", str(good), "--preset", "pytorch"],
         "unknown loss-scaling preset 'pytorch' (did you mean 'torch'?); valid names: torch,"),
        (["check-scaler", str(good), "--preset", "deepspeeed"], "(did you mean 'deepspeed'?)"),
        (["check-scaler", str(tmp_path / "none.jsonl"), "--preset", "tensorflow"],
         "(did you mean 'tf-keras'?)"),
        (["check-scaler", str(good), "--preset", "torch", "--param", "x=1"], "unknown parameter"),
        (["check-scaler", str(good), "--preset", "torch", "--param", "growth_factor=0.5"],
         "growth_factor must be > 1"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.startswith("fpsim check-scaler: error:"), err
    with pytest.raises(SystemExit) as info:              # argparse: --preset is required
        main(["check-scaler", str(good)])
    assert info.value.code == 2
    capsys.readouterr()


def test_register_adds_both_commands_to_any_parser():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("other")
    register(sub)
    args = parser.parse_args(["check-cast", "a.npy", "-f", "fp16", "--against", "b.npy"])
    assert (args.command, args.format, args.bits, args.mode) == ("check-cast", "fp16", False,
                                                                 "nearest_even")
    assert COMMANDS == ("check-scaler", "check-cast")
    assert run(parser.parse_args(["other"])) == 2


def test_a_header_param_in_another_frameworks_convention_is_named_and_mapped(tmp_path,
                                                                             capsys):
    """torch multiplies by backoff_factor 0.5, DeepSpeed divides by 2: checking a torch trace
    against deepspeed says so and gives the --param that maps it; mapped, the check compares
    (and finds the frameworks' own difference: DeepSpeed counts its growth tracker from -1)."""
    path = write_preset_trace(tmp_path / "t.jsonl", "torch", FLAGS, backoff_factor=0.5,
                              growth_interval=3)
    assert main(["check-scaler", str(path), "--preset", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "map them with --param backoff_factor=2.0, or pass --ignore-header-params" in err
    assert main(["check-scaler", str(path), "--preset", "deepspeed", "--param",
                 "backoff_factor=2.0", "--param", "hysteresis=1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("DIVERGED at step 0") and "growth_tracker  1" in out


def test_a_planted_ignored_overflow_is_caught_in_one_line(tmp_path, capsys):
    path = write_preset_trace(tmp_path / "t.jsonl", "torch", [False] * 3)
    lines = path.read_text().splitlines()
    row = json.loads(lines[2])                  # step 1: inf gradients, found_inf left false
    row["grad_stats"] = {"count": 161, "nonfinite": 18}
    lines[2] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    assert main(["check-scaler", str(path), "--preset", "torch"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("MISSED OVERFLOW at step 1 (trace line 3), after 1 agreeing step: "
                      "found_inf=false but grad_stats counts 18 non-finite gradient elements; "
                      "the step applied them")


def test_a_planted_misconfiguration_is_caught_by_expect(tmp_path, capsys):
    """The header records the real scaler's growth_interval=7 and the replay applies it, so
    the trace agrees with itself; --expect and --expect-preset say what was intended."""
    path = write_preset_trace(tmp_path / "t.jsonl", "torch", FLAGS, growth_interval=7,
                              backoff_factor=0.5)
    base = ["check-scaler", str(path), "--preset", "torch"]
    assert main(base) == 0
    capsys.readouterr()
    assert main(base + ["--expect", "growth_interval=2000"]) == 1
    assert capsys.readouterr().out == ("MISCONFIGURED: the trace header records growth_interval=7"
                                       ", expected 2000 (--expect)\n")
    assert main(base + ["--expect-preset", "torch"]) == 1
    assert capsys.readouterr().out == ("MISCONFIGURED: the trace header records growth_interval=7"
                                       ", expected 2000 (preset torch)\n")
    assert main(base + ["--expect-preset", "torch", "--expect", "growth_interval=7"]) == 0
    assert capsys.readouterr().out.startswith("agree: 19 of 19")
    # torch's multiplier 0.5 is DeepSpeed's divisor 2.0: the same backoff, not a mismatch
    assert main(base + ["--expect", "backoff_factor=2.0", "--expect", "growth_interval=7"]) == 0
    capsys.readouterr()
    assert main(base + ["--expect", "min_scale=1"]) == 1
    assert "does not record min_scale (expected min_scale=1.0)" in capsys.readouterr().out


def test_expect_bad_input_exits_2_and_names_the_option(tmp_path, capsys):
    path = write_preset_trace(tmp_path / "t.jsonl", "torch", FLAGS, growth_interval=7)
    base = ["check-scaler", str(path), "--preset", "torch"]
    cases = [(["--expect", "growth_interval"], "--expect 'growth_interval': write KEY=VALUE"),
             (["--expect", "speed=3"], "--expect 'speed=3': unknown parameter 'speed'"),
             (["--expect", "growth_interval=7", "--expect", "growth_interval=8"],
              "growth_interval is already expected (7)"),
             (["--expect-preset", "pytorch"], "(did you mean 'torch'?)")]
    for extra, words in cases:
        assert main(base + extra) == 2, extra
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1
        assert words in captured.err and captured.err.startswith("fpsim check-scaler: error:")


def test_a_param_the_preset_cannot_take_is_blamed_not_the_header(tmp_path, capsys):
    path = write_preset_trace(tmp_path / "d.jsonl", "deepspeed", FLAGS, growth_interval=3)
    assert main(["check-scaler", str(path), "--preset", "deepspeed",
                 "--param", "min_scale=none"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "header" not in err
    assert err.startswith("fpsim check-scaler: error: --param min_scale=None: preset "
                          "'deepspeed' cannot take it: raise_at_min=True needs a min_scale; "
                          "add --param raise_at_min=false")
    assert main(["check-scaler", str(path), "--preset", "deepspeed", "--param",
                 "min_scale=none", "--param", "raise_at_min=false"]) == 0
    capsys.readouterr()


def test_a_diverged_report_shows_both_backoff_conventions(tmp_path, capsys):
    path = write_preset_trace(tmp_path / "d.jsonl", "deepspeed", FLAGS, growth_interval=3,
                              backoff_factor=2.0)
    assert main(["check-scaler", str(path), "--preset", "deepspeed",
                 "--param", "hysteresis=1"]) == 1
    assert ("  backoff:   recorded backoff_factor=2.0: scale / 2.0 = scale x 0.5; reference "
            "scale / 2.0 = scale x 0.5") in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("twice", [["growth_interval=2", "growth_interval=5"],
                                   ["init_scale=2**10", "init_scale=0x1p10"]])
def test_a_param_given_twice_is_refused(tmp_path, capsys, twice):
    good = write_preset_trace(tmp_path / "g.jsonl", "torch", FLAGS)
    argv = ["check-scaler", str(good), "--preset", "torch"]
    for text in twice:
        argv += ["--param", text]
    assert main(argv) == 2
    captured = capsys.readouterr()
    key = twice[0].partition("=")[0]
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith(f"fpsim check-scaler: error: --param {twice[1]!r}: {key} is "
                                   f"already set")
