"""Real torch.amp.GradScaler("cpu") through the conformance machinery: the adapter driven by
overflow patterns against the torch preset (>= 10,000 steps), its unscale numerics bit for
bit, and a real small training run recorded to a trace, replayed and checked by the CLI."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fpsim.conformance import (clean_runs, compare, read_trace, replay,  # noqa: E402
                               standard_patterns)
from fpsim.conformance import cli  # noqa: E402
from fpsim.conformance.torch_adapter import (GradScalerAdapter, GradScalerRecorder,  # noqa: E402
                                             check_unscale)

# (name, GradScaler keyword arguments = preset overrides, patterns)
CONFIGS = [
    ("interval 5", dict(growth_interval=5), None),
    ("odd factors", dict(init_scale=1000.1, growth_factor=1.5, backoff_factor=0.3,
                         growth_interval=3), None),
    ("default interval 2000", dict(growth_interval=2000),
     [("interval boundaries", np.concatenate([[False] * 2000, [True], [False] * 1999, [True],
                                              [False] * 2001, [True], [False] * 2]))]),
    ("interval 1, 1.0001 growth", dict(growth_factor=1.0001, backoff_factor=0.9999,
                                       growth_interval=1),
     [("clean runs", clean_runs(1, runs=40))]),
]


def patterns_of(kwargs, patterns):
    return patterns or standard_patterns("torch", seed=1, **kwargs)


@pytest.mark.parametrize("label,kwargs,patterns", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_gradscaler_matches_torch_preset_through_the_adapter(label, kwargs, patterns):
    for name, flags in patterns_of(kwargs, patterns):
        report = compare(GradScalerAdapter(**kwargs), flags, "torch", **kwargs)
        assert report.agree, f"{label} / {name}:\n{report}"
        assert report.steps_compared == len(flags)
        assert report.compared == ("scale_before", "scale_after", "skipped", "growth_tracker")


def test_at_least_ten_thousand_steps_in_several_patterns():
    runs = [len(flags) for _, kwargs, patterns in CONFIGS
            for _, flags in patterns_of(kwargs, patterns)]
    assert len(runs) >= 12 and sum(runs) >= 10_000          # 20 runs, 14,073 steps


def test_the_adapter_sees_a_different_rule_as_a_divergence():
    report = compare(GradScalerAdapter(growth_interval=4), [False] * 10, "torch",
                     growth_interval=5)
    assert not report.agree and report.divergence.step == 3
    assert set(report.divergence.fields) == {"scale_after", "growth_tracker"}


def random_f32(rng, n, *, positive=False):
    top = 2 ** 31 if positive else 2 ** 32
    return rng.integers(0, top, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_unscale_numerics_bit_for_bit():
    """inv_scale and every unscaled gradient, for random float32 bit patterns (subnormals,
    inf, NaN included) and random float32 scales across the whole range."""
    rng = np.random.default_rng(7)
    scales = random_f32(rng, 400, positive=True)
    scales = scales[np.isfinite(scales) & (scales > 0)]
    scales = np.concatenate([scales, np.float32([2.0 ** -149, 2.0 ** 127, 1.0, 3.0,
                                                 np.float32(3.4028235e38)])])
    checked = 0
    for i, scale in enumerate(scales):
        grads = random_f32(rng, 1000)
        if i % 2:
            grads = grads[np.isfinite(grads)]
        result = check_unscale(grads, float(scale))
        assert result.agree, (float(scale), result)
        assert result.found_inf_torch == (not np.isfinite(grads).all())
        checked += grads.size
    assert checked > 250_000


def test_check_unscale_can_fail(monkeypatch):
    """A division by the scale instead of torch's reciprocal multiply is caught."""
    from fpsim.conformance import torch_adapter
    monkeypatch.setattr(torch_adapter, "unscale",
                        lambda g, state: (g / np.float32(state.scale)).astype(np.float32))
    grads = random_f32(np.random.default_rng(3), 5000)
    grads = grads[np.isfinite(grads)]
    result = check_unscale(grads, 3.0)
    assert not result.agree and result.mismatches.size > 0
    assert result.inv_scale_torch == result.inv_scale_ours == float(np.float32(1 / 3))


def test_check_unscale_rejects_other_input():
    with pytest.raises(TypeError, match="1-d float32"):
        check_unscale(np.zeros(3), 2.0)


def train_and_record(path, steps=80, growth_interval=3):
    """A 2-layer MLP on synthetic data, bf16 autocast on CPU, GradScaler("cpu") starting at
    2**127 so that real gradients overflow and the scale backs off and grows again."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(32, 8)
    y = x[:, :1] * 3.0 + 1.0
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=growth_interval)
    losses = []
    with GradScalerRecorder(scaler, path) as recorder:
        for _ in range(steps):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            recorder.step(optimizer)
            losses.append(loss.item())
    return losses


def test_real_training_run_is_recorded_replayed_and_checked(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    losses = train_and_record(path)
    trace = read_trace(path)
    assert len(trace.steps) == 80 and losses[-1] < losses[0]
    header = json.loads(path.read_text().splitlines()[0])
    assert header["params"]["init_scale"] == 2.0 ** 127 and header["source"].startswith("torch")
    overflows = [s for s in trace.steps if s.found_inf]
    assert len(overflows) >= 3 and any(s.scale_after > s.scale_before for s in trace.steps)
    for step in trace.steps:              # torch's found_inf vs the gradients it left behind
        assert step.skipped == step.found_inf
        assert (step.grad_stats["nonfinite"] > 0) == step.found_inf
        assert step.grad_stats["count"] == 8 * 16 + 16 + 16 + 1
    assert replay(trace, "torch").agree

    parser = cli_parser()
    assert cli.run(parser.parse_args(["check-scaler", str(path), "--preset", "torch"])) == 0
    assert "agree: 80 of 80 steps match preset torch" in capsys.readouterr().out
    status = cli.run(parser.parse_args(["check-scaler", str(path), "--preset", "torch",
                                        "--param", "growth_interval=4"]))
    out = capsys.readouterr().out
    assert status == 1 and "DIVERGED at step" in out and "<- differs" in out
    assert "recorded:  torch 2.13" in out or "recorded:  torch" in out


def test_recorder_must_start_with_the_scaler(tmp_path):
    adapter = GradScalerAdapter(growth_interval=5)
    adapter.update(False)
    with pytest.raises(ValueError, match="before the GradScaler's first step"):
        GradScalerRecorder(adapter.scaler, tmp_path / "late.jsonl")


def cli_parser():
    import argparse
    parser = argparse.ArgumentParser(prog="fpsim")
    cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_two_optimizers_under_one_scaler_are_one_update_per_iteration(tmp_path):
    """scaler.step(o1); scaler.step(o2); scaler.update(): recorded as one line per update
    (found_inf from both), replayed in agreement; stepping them one by one is refused."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
    o1 = torch.optim.SGD(first.parameters(), lr=1e-2)
    o2 = torch.optim.SGD(second.parameters(), lr=1e-2)
    x = torch.randn(32, 8)
    y = x[:, :1] * 3.0 + 1.0
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=3)
    path = tmp_path / "two.jsonl"
    with GradScalerRecorder(scaler, path) as recorder:
        for _ in range(40):
            o1.zero_grad()
            o2.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(second(torch.relu(first(x))).float(), y)
            scaler.scale(loss).backward()
            assert len(recorder.step([o1, o2])) == 2
        with pytest.raises(ValueError, match=r"recorder.step\(\[o1, o2\]\)"):
            recorder.step(o1)
    trace = read_trace(path)
    assert len(trace.steps) == 40 and sum(s.found_inf for s in trace.steps) >= 3
    assert all(s.grad_stats["count"] == 8 * 16 + 16 + 16 + 1 for s in trace.steps)
    assert replay(trace, "torch").agree
