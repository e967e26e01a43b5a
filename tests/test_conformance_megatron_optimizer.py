"""Megatron-core 0.16.1's fp16 optimizer in a real training loop on CPU against preset megatron.

A tiny fp16 model trained by ``Float16OptimizerWithFloat16Params`` (fp32 main params, SGD
inside, Megatron's default gradient clipping at 1.0) with a ``DynamicGradScaler``; at the
planted steps the forward pass overflows fp16 (the output times 1e5), elsewhere the batch is
ordinary and the scale grows until the gradients overflow by themselves. The
``MegatronOptimizerRecorder`` trace (Megatron's own found_inf, the skip seen by a hook, the
scaler's scale, tracker and hysteresis counter) is written to a file and replayed through
preset ``megatron``; presets with a planted bug must diverge.

Optional: skipped without megatron-core (``pip install --no-deps megatron-core==0.16.1``)."""
import warnings

import numpy as np
import pytest

from fpsim.conformance import bursts, clean_runs, collapse, random_flags, read_trace, replay

torch = pytest.importorskip("torch", reason="Megatron-core's optimizer needs torch")


@pytest.fixture(scope="module")
def megatron():
    with warnings.catch_warnings():     # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore", UserWarning)
        pytest.importorskip("megatron.core.optimizer", reason="megatron-core not installed: "
                            "pip install --no-deps megatron-core==0.16.1")
        from megatron.core.optimizer import grad_scaler, optimizer, optimizer_config
    from fpsim.conformance import megatron_recorder
    megatron_recorder.single_process_model_parallel()
    return grad_scaler, optimizer, optimizer_config, megatron_recorder


def fp16_optimizer(megatron, **scaler_kwargs):
    grad_scaler, optimizer, optimizer_config, recorder = megatron
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).half()
    kwargs = dict(initial_scale=2.0 ** 8, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                  growth_interval=4, hysteresis=2) | scaler_kwargs
    with recorder.megatron_on_cpu():
        scaler = grad_scaler.DynamicGradScaler(**kwargs)
        fp16 = optimizer.Float16OptimizerWithFloat16Params(
            torch.optim.SGD(model.parameters(), lr=1e-3),
            optimizer_config.OptimizerConfig(fp16=True), scaler, lambda _: None)
    return model, fp16


def train(megatron, flags, path, **scaler_kwargs):
    """Train on ``flags`` (True: an fp16 overflow in that step's forward pass), recording to
    ``path``; returns the trace read back."""
    model, fp16 = fp16_optimizer(megatron, **scaler_kwargs)
    x = torch.randn(8, 4).half()
    with megatron[3].MegatronOptimizerRecorder(fp16, path) as recorder:
        for flag in flags:
            fp16.zero_grad()
            out = model(x) * (1e5 if flag else 1.0)       # 1e5 > fp16's largest, 65504
            loss = out.float().pow(2).mean()
            fp16.scale_loss(loss).backward()
            recorder.step()
    return read_trace(path)


PATTERNS = [("clean runs", clean_runs(4, runs=2)),
            ("bursts", bursts(60, 5, 3, seed=1)),
            ("random 20%", random_flags(60, 0.2, seed=2)),
            ("collapse", collapse("megatron", tail=20, init_scale=2.0 ** 8, min_scale=1.0)),
            ("clean", np.zeros(80, bool))]     # 20 growths due: the gradients overflow first


@pytest.mark.parametrize("hysteresis", [2, 1])
def test_megatron_fp16_optimizer_matches_the_megatron_preset(megatron, tmp_path, hysteresis):
    total = natural = 0
    for name, flags in PATTERNS:
        trace = train(megatron, flags, tmp_path / f"{name}.jsonl", hysteresis=hysteresis)
        found = np.array([s.found_inf for s in trace.steps])
        assert found[flags].all(), name               # every planted overflow was found
        assert all(s.skipped == s.found_inf for s in trace.steps), name
        report = replay(trace, "megatron")
        assert report.agree, f"{name}:\n{report}"
        total += report.steps_compared
        natural += int((found & ~flags).sum())
    assert total == sum(len(f) for _, f in PATTERNS)
    assert natural > 0            # the scale also grew into overflows of its own


def test_planted_bugs_in_the_megatron_preset_are_caught(megatron, tmp_path):
    trace = train(megatron, bursts(60, 5, 3, seed=1), tmp_path / "run.jsonl")
    assert replay(trace, "megatron").agree
    no_hysteresis = replay(trace, "megatron", hysteresis=1)
    assert not no_hysteresis.agree and "hysteresis" in no_hysteresis.divergence.fields
    wrong_interval = replay(trace, "megatron", growth_interval=5)
    assert not wrong_interval.agree


def test_recorder_refuses_a_stepped_or_constant_scaler(megatron, tmp_path):
    grad_scaler, optimizer, optimizer_config, recorder = megatron
    model, fp16 = fp16_optimizer(megatron)
    fp16.grad_scaler.update(False)
    with pytest.raises(ValueError, match="before the optimizer's first step"):
        recorder.MegatronOptimizerRecorder(fp16, tmp_path / "late.jsonl")
    with recorder.megatron_on_cpu():
        constant = optimizer.Float16OptimizerWithFloat16Params(
            torch.optim.SGD(torch.nn.Linear(2, 1).half().parameters(), lr=1e-3),
            optimizer_config.OptimizerConfig(fp16=True), grad_scaler.ConstantGradScaler(8.0),
            lambda _: None)
    with pytest.raises(ValueError, match="DynamicGradScaler"):
        recorder.MegatronOptimizerRecorder(constant, tmp_path / "constant.jsonl")
