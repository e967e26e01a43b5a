"""DeepSpeed 0.19.6's fp16 optimizer in a real training loop against preset deepspeed-fp16.

A tiny fp16 model trained by ``FP16_Optimizer`` (SGD inside) on CPU, built directly because
DeepSpeed's engine refuses fp16 without an accelerator; at the planted steps the forward pass
overflows fp16 (the output times 1e5), elsewhere the scale grows until the gradients overflow
by themselves. The ``FP16OptimizerRecorder`` trace is written to a file and replayed; a
preset with a planted bug, a planted ignored overflow and a planted misconfiguration are each
caught. The ``gpu`` test records the engine itself (``deepspeed.initialize``, fp16, no ZeRO).

Optional: skipped without deepspeed (``pip install --no-deps deepspeed==0.19.6 hjson einops
py-cpuinfo && pip install pydantic``)."""
import json
import warnings

import pytest

from fpsim.conformance import cli, read_trace, replay

torch = pytest.importorskip("torch", reason="DeepSpeed's fp16 optimizer needs torch")

FLAGS = [False] * 5 + [True, True] + [False] * 12 + [True] + [False] * 40


@pytest.fixture(scope="module")
def deepspeed_recorder():
    pytest.importorskip("deepspeed", reason="deepspeed not installed: pip install --no-deps "
                                            "deepspeed==0.19.6 hjson einops py-cpuinfo")
    from fpsim.conformance import deepspeed_recorder
    deepspeed_recorder.single_process_group()
    return deepspeed_recorder


def fp16_optimizer(**loss_args):
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).half()
    args = {"init_scale": 2.0 ** 8, "scale_window": 3, "min_scale": 1.0} | loss_args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                   dynamic_loss_scale=True, verbose=False,
                                   dynamic_loss_args=args)
    return model, optimizer


def train(recorder_module, flags, path, **loss_args):
    model, optimizer = fp16_optimizer(**loss_args)
    x = torch.randn(8, 4).half()
    with recorder_module.FP16OptimizerRecorder(optimizer, path) as recorder:
        for flag in flags:
            optimizer.zero_grad()
            out = model(x) * (1e5 if flag else 1.0)        # 1e5 > fp16's largest, 65504
            optimizer.backward(out.float().pow(2).mean())
            recorder.step()
    return read_trace(path)


def test_a_real_fp16_optimizer_loop_agrees_with_deepspeed_fp16(deepspeed_recorder, tmp_path,
                                                                capsys):
    path = tmp_path / "ds.jsonl"
    trace = train(deepspeed_recorder, FLAGS, path)
    assert len(trace.steps) == len(FLAGS) and "FP16_Optimizer" in trace.header.source
    planted = [i for i, flag in enumerate(FLAGS) if flag]
    found = [s.step for s in trace.steps if s.found_inf]
    assert set(planted) < set(found)                # and the growing scale's own overflows
    assert all(s.skipped == s.found_inf == (s.grad_stats["nonfinite"] > 0)
               for s in trace.steps)
    report = replay(path, "deepspeed-fp16")
    assert report.agree and report.steps_compared == len(FLAGS), report
    assert not replay(path, "deepspeed", **trace.header.params).agree    # ZeRO's hysteresis
    base = ["check-scaler", str(path), "--preset", "deepspeed-fp16"]
    assert cli.main(base + ["--expect", "growth_interval=1000"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "MISCONFIGURED: the trace header records growth_interval=3, expected 1000 (--expect)"]


def test_an_ignored_overflow_in_the_recorded_loop_is_caught(deepspeed_recorder, tmp_path,
                                                            capsys):
    path = tmp_path / "ds.jsonl"
    train(deepspeed_recorder, FLAGS[:8], path)
    lines = path.read_text().splitlines()
    row = json.loads(lines[6])                      # step 5: the planted overflow
    row.update(found_inf=False, skipped=False, scale_after=row["scale_before"])
    lines[6] = json.dumps(row)
    path.write_text("\n".join(lines[:7]) + "\n")
    assert cli.main(["check-scaler", str(path), "--preset", "deepspeed-fp16"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("MISSED OVERFLOW at step 5 (trace line 7), after 5 agreeing "
                            "steps: found_inf=false but grad_stats counts ")
    assert first.endswith("non-finite gradient elements; the step applied them")


def test_the_recorder_refuses_what_it_cannot_record(deepspeed_recorder, tmp_path):
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    model = torch.nn.Linear(4, 2).half()
    static = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=1e-3), verbose=False)
    with pytest.raises(ValueError, match="needs a dynamic loss scale"):
        deepspeed_recorder.FP16OptimizerRecorder(static, tmp_path / "s.jsonl")
    with pytest.raises(ValueError, match="non-ZeRO fp16 optimizers"):
        deepspeed_recorder.FP16OptimizerRecorder(torch.optim.SGD(model.parameters()),
                                                 tmp_path / "t.jsonl")
    model, optimizer = fp16_optimizer()
    optimizer.zero_grad()
    optimizer.backward(model(torch.randn(2, 4).half()).float().sum())
    optimizer.step()
    with pytest.raises(ValueError, match="before the optimizer's first step"):
        deepspeed_recorder.FP16OptimizerRecorder(optimizer, tmp_path / "u.jsonl")
    assert not (tmp_path / "s.jsonl").exists() and not (tmp_path / "u.jsonl").exists()


@pytest.mark.gpu
def test_the_fp16_engine_on_cuda_is_recorded_and_agrees(deepspeed_recorder, tmp_path):
    """deepspeed.initialize with fp16 (no ZeRO) on a CUDA device: the engine wraps a torch
    SGD in its own FP16_UnfusedOptimizer, stepped through engine.step()."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: DeepSpeed's engine refuses fp16 on CPU")
    import deepspeed
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": 8, "fp16": {
        "enabled": True, "initial_scale_power": 8, "loss_scale_window": 3, "hysteresis": 2,
        "min_loss_scale": 1}, "zero_optimization": {"stage": 0}}
    model = torch.nn.Linear(4, 2)
    engine, *_ = deepspeed.initialize(model=model, config=config, optimizer=torch.optim.SGD(
        model.parameters(), lr=1e-3))
    path = tmp_path / "engine.jsonl"
    x = torch.randn(8, 4, device=engine.device).half()
    with deepspeed_recorder.FP16OptimizerRecorder(engine, path) as recorder:
        for flag in FLAGS:
            out = engine(x) * (1e5 if flag else 1.0)
            engine.backward(out.float().pow(2).mean())
            recorder.step()
    trace = read_trace(path)
    assert len(trace.steps) == len(FLAGS) and "DeepSpeedEngine" in trace.header.source
    report = replay(path, "deepspeed-fp16")
    assert report.agree, report
