"""The real DeepSpeed and Megatron-core loss scalers on CPU against the presets.

Each scaler is driven through the standard overflow patterns (``fpsim.conformance.patterns``),
its trace written to a file (errors included: DeepSpeed stops at its minimum scale) and
replayed through the matching preset: ``DynamicLossScaler`` (ZeRO's) against ``deepspeed``,
the non-ZeRO ``FP16_Optimizer`` against ``deepspeed-fp16``, Megatron-core's
``DynamicGradScaler`` against ``megatron``. A preset with a planted bug must diverge.

Optional: skipped without the packages. ``.ci/run`` installs them beside torch 2.13.0 with
``pip install --no-deps deepspeed==0.19.6 megatron-core==0.16.1 hjson einops``."""
import argparse
import warnings

import numpy as np
import pytest

from fpsim.conformance import (cli, read_trace, record, replay, standard_patterns,
                               write_trace)

pytest.importorskip("torch", reason="the DeepSpeed and Megatron-core scalers need torch")


@pytest.fixture(scope="module")
def deepspeed_adapters():
    pytest.importorskip("deepspeed", reason="deepspeed not installed: pip install --no-deps "
                                            "deepspeed==0.19.6 hjson einops")
    from fpsim.conformance import deepspeed_adapters
    return deepspeed_adapters


@pytest.fixture(scope="module")
def megatron_adapter():
    with warnings.catch_warnings():     # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore", UserWarning)
        pytest.importorskip("megatron.core.optimizer", reason="megatron-core not installed: "
                            "pip install --no-deps megatron-core==0.16.1")
    from fpsim.conformance import megatron_adapter
    return megatron_adapter


def recorded_file(adapter, flags, path):
    """Record ``adapter`` on ``flags`` (a raise ends the trace as its ``error`` step), write
    the trace to ``path`` and return the path."""
    trace = record(adapter, flags, errors="record")
    write_trace(path, trace.steps, source=trace.header.source, params=trace.header.params)
    return path


def run_patterns(make_adapter, preset, tmp_path, **overrides):
    """Every standard pattern of ``preset`` (with ``overrides``) through a fresh adapter, as
    a trace file replayed through the preset: {pattern name: (Report, flags, trace path)}."""
    out = {}
    for index, (name, flags) in enumerate(standard_patterns(preset, **overrides)):
        path = recorded_file(make_adapter(), flags, tmp_path / f"{preset}-{index}.jsonl")
        out[name] = (replay(path, preset), flags, path)
    return out


def assert_all_agree(reports, minimum_steps):
    for name, (report, _, _) in reports.items():
        assert report.agree, f"{name}:\n{report}"
    assert sum(r.steps_compared for r, _, _ in reports.values()) >= minimum_steps


# --- DeepSpeed ------------------------------------------------------------------------------

DYNAMIC_LOSS_SCALER_CONFIGS = [
    ("window 5", dict(scale_window=5)),
    ("consecutive hysteresis, shift 3", dict(scale_window=4, delayed_shift=3,
                                             consecutive_hysteresis=True)),
    ("no raise at the floor, odd start", dict(init_scale=1000.1, scale_window=3, min_scale=0.5,
                                              raise_error_at_min_scale=False)),
]


@pytest.mark.parametrize("kwargs", [c[1] for c in DYNAMIC_LOSS_SCALER_CONFIGS],
                         ids=[c[0] for c in DYNAMIC_LOSS_SCALER_CONFIGS])
def test_deepspeed_dynamic_loss_scaler_matches_the_deepspeed_preset(deepspeed_adapters,
                                                                      tmp_path, kwargs):
    """Every pattern agrees (scale, tracker, hysteresis, and the raise at the floor), except
    where the scale has grown to inf: DeepSpeed 0.19.6's overflow log line formats
    ``int(self.cur_scale)`` and raises OverflowError there, which the preset does not model.
    A version without that log line agrees there too."""
    make = lambda: deepspeed_adapters.DynamicLossScalerAdapter(**kwargs)  # noqa: E731
    params = make().params
    reports = run_patterns(make, "deepspeed", tmp_path, **params)
    report, flags, _ = reports.pop("growth to the limit")
    if not report.agree:
        first_overflow = int(np.argmax(flags))
        assert report.divergence.fields == ("error",), report
        assert report.divergence.step == report.steps_compared == first_overflow
        assert report.divergence.recorded["scale_before"] == float("inf")
        assert report.divergence.recorded["error"].startswith("OverflowError")
    assert_all_agree(reports, 1300)
    collapse_report, collapse_flags, collapse_path = reports["collapse"]
    last = read_trace(collapse_path).steps[-1]
    if kwargs.get("raise_error_at_min_scale", True):      # stopped at the floor, as the preset
        assert collapse_report.total_steps < len(collapse_flags) and last.error is not None
    else:
        assert collapse_report.total_steps == len(collapse_flags) and last.error is None


def test_deepspeed_fp16_optimizer_matches_the_deepspeed_fp16_preset(deepspeed_adapters,
                                                                     tmp_path):
    """The real non-ZeRO step: DeepSpeed's own overflow check on an inf/1.0 gradient, its
    ``_update_scale`` (no hysteresis, no raise at the floor), the skip seen by a hook."""
    make = lambda: deepspeed_adapters.FP16OptimizerAdapter(scale_window=5)  # noqa: E731
    reports = run_patterns(make, "deepspeed-fp16", tmp_path, growth_interval=5)
    assert_all_agree(reports, 8000)


def test_planted_bugs_in_the_deepspeed_presets_are_caught(deepspeed_adapters, tmp_path):
    flags = np.r_[np.zeros(12, bool), True, False, True, np.zeros(12, bool), [True] * 3]
    zero = recorded_file(deepspeed_adapters.DynamicLossScalerAdapter(scale_window=5), flags,
                         tmp_path / "zero.jsonl")
    assert replay(zero, "deepspeed").agree
    no_hysteresis = replay(zero, "deepspeed", hysteresis=1)     # the recorded counter shows it
    assert not no_hysteresis.agree and no_hysteresis.divergence.fields == ("hysteresis",)
    wrong_backoff = replay(zero, "deepspeed", backoff_factor=4.0)  # step 12 was absorbed
    assert not wrong_backoff.agree and wrong_backoff.divergence.step == 14
    assert wrong_backoff.divergence.fields == ("scale_after",)
    fused = recorded_file(deepspeed_adapters.FP16OptimizerAdapter(scale_window=5), flags,
                          tmp_path / "fused.jsonl")
    assert replay(fused, "deepspeed-fp16").agree
    wrong_backoff = replay(fused, "deepspeed-fp16", backoff_factor=4.0)
    assert not wrong_backoff.agree and wrong_backoff.divergence.step == 12
    with_hysteresis = replay(fused, "deepspeed")            # ZeRO's hysteresis on FP16_Optimizer
    assert not with_hysteresis.agree and with_hysteresis.divergence.step == 12


def test_deepspeed_trace_file_through_check_scaler(deepspeed_adapters, tmp_path, capsys):
    flags = np.r_[np.zeros(7, bool), True, True, np.zeros(6, bool)]
    path = recorded_file(deepspeed_adapters.DynamicLossScalerAdapter(scale_window=3), flags,
                         tmp_path / "ds.jsonl")
    parser = argparse.ArgumentParser(prog="fpsim")
    cli.register(parser.add_subparsers(dest="command"))
    assert cli.run(parser.parse_args(["check-scaler", str(path), "--preset", "deepspeed"])) == 0
    assert "agree: 15 of 15 steps" in capsys.readouterr().out
    assert cli.run(parser.parse_args(["check-scaler", str(path), "--preset", "deepspeed",
                                      "--param", "backoff_factor=4"])) == 1
    assert "DIVERGED at step 8" in capsys.readouterr().out      # step 7 was absorbed


# --- Megatron-core --------------------------------------------------------------------------

MEGATRON_CONFIGS = [
    ("interval 5", dict(growth_interval=5)),
    ("hysteresis 3, odd factors", dict(initial_scale=1000.1, growth_factor=1.5,
                                       backoff_factor=0.3, growth_interval=3, hysteresis=3,
                                       min_scale=0.01)),
    ("no hysteresis", dict(growth_interval=4, hysteresis=1)),
]


@pytest.mark.parametrize("kwargs", [c[1] for c in MEGATRON_CONFIGS],
                         ids=[c[0] for c in MEGATRON_CONFIGS])
def test_megatron_dynamic_grad_scaler_matches_the_megatron_preset(megatron_adapter, tmp_path,
                                                                  kwargs):
    make = lambda: megatron_adapter.DynamicGradScalerAdapter(**kwargs)  # noqa: E731
    params = make().params
    assert_all_agree(run_patterns(make, "megatron", tmp_path, **params), 3000)


def test_planted_bugs_in_the_megatron_preset_are_caught(megatron_adapter, tmp_path):
    """DeepSpeed-style hysteresis (the counter stops at 1 on a backoff) differs from
    Megatron's (it keeps falling, so every overflow after the first backoff backs off)."""
    flags = np.r_[np.zeros(3, bool), True, True, False, True, np.zeros(8, bool)]
    path = recorded_file(megatron_adapter.DynamicGradScalerAdapter(growth_interval=4), flags,
                         tmp_path / "megatron.jsonl")
    assert replay(path, "megatron").agree
    stops_at_one = replay(path, "megatron", hysteresis_decrement_on_backoff=False)
    assert not stops_at_one.agree and stops_at_one.divergence.step == 4
    assert stops_at_one.divergence.fields == ("hysteresis",)
    wrong_precision = replay(path, "megatron", backoff_factor=0.25)
    assert not wrong_precision.agree and wrong_precision.divergence.step == 4


def test_megatron_scaler_tensors_are_on_cpu(megatron_adapter):
    import torch
    adapter = megatron_adapter.DynamicGradScalerAdapter()
    if not torch.cuda.is_available():
        assert adapter.scaler.scale.device.type == "cpu"
        assert adapter.scaler.min_scale.dtype == torch.float32
    assert adapter.params["init_scale"] == 2.0 ** 32
