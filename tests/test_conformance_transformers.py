"""A real Hugging Face ``Trainer`` run in fp16 mixed precision, recorded by the transformers
ScalerTraceCallback and replayed through the torch preset.

On CPU, ``Trainer(fp16=True)`` gets its GradScaler("cpu") and float16 autocast from
``use_cpu_grad_scaler``; the ``gpu`` test runs the Trainer's own CUDA scaler.

Optional: skipped without transformers (not installed by CI). To run it:
``pip install --no-deps transformers==5.23.0 accelerate==1.15.0 tokenizers==0.23.3
safetensors==0.8.0 huggingface-hub==2.4.0 && pip install httpx2 && python -m pytest
tests/test_conformance_transformers.py``."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="transformers' Trainer needs torch")
INSTALL = ("transformers not installed: pip install --no-deps transformers==5.23.0 "
           "accelerate==1.15.0 tokenizers==0.23.3 safetensors==0.8.0 huggingface-hub==2.4.0 "
           "&& pip install httpx2 regex")
transformers = pytest.importorskip("transformers", reason=INSTALL)
pytest.importorskip("accelerate", reason=INSTALL)

from fpsim.conformance import read_trace, replay  # noqa: E402
from fpsim.conformance.transformers_recorder import (ScalerTraceCallback,  # noqa: E402
                                                     use_cpu_grad_scaler)


class Regression(torch.nn.Module):
    """A model in the Trainer's convention: ``forward(**batch)`` returns the loss."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.net(x).float(), labels)}


class AccelerateSkips(transformers.TrainerCallback):
    """What accelerate itself says of each optimizer step (``step_was_skipped``)."""

    def __init__(self):
        self.skipped = []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.skipped.append(bool(optimizer.step_was_skipped))


def make_trainer(callback, steps, out, *, optim, use_cpu=True, fp16=True):
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    data = [{"x": row, "labels": row[:1] * 3.0 + 1.0} for row in x]
    with warnings.catch_warnings():    # deprecations inside torch.jit and transformers
        warnings.simplefilter("ignore", DeprecationWarning)
        args = transformers.TrainingArguments(
            output_dir=str(out), fp16=fp16, use_cpu=use_cpu,
            max_steps=steps, per_device_train_batch_size=32, learning_rate=1e-2, optim=optim,
            max_grad_norm=0.0, report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, seed=0)
        return transformers.Trainer(model=Regression(), args=args, train_dataset=data,
                                    callbacks=[callback])


def train(trainer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()


@pytest.mark.parametrize("optim", ["sgd", "adamw_torch_fused"])
def test_fp16_trainer_on_cpu_is_recorded_and_agrees_with_the_torch_preset(tmp_path, optim):
    """From 2**24 the float16 gradients overflow for several steps, then the scale
    see-saws (growth every 3 clean steps): real overflows. SGD's skips are seen by its step
    hook; the fused AdamW (the Trainer's default) always steps and skips inside its kernel,
    seen by its step counters."""
    path = tmp_path / f"hf-{optim}.jsonl"
    trainer = make_trainer(ScalerTraceCallback(path), 40, tmp_path, optim=optim)
    accelerate_says = AccelerateSkips()
    trainer.add_callback(accelerate_says)
    scaler = use_cpu_grad_scaler(
        trainer, torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=3))
    train(trainer)
    trace = read_trace(path)
    assert trainer.accelerator.scaler is scaler
    assert len(trace.steps) == 40 and sum(s.found_inf for s in trace.steps) >= 5
    assert any(not s.found_inf for s in trace.steps)
    assert all(s.skipped == s.found_inf for s in trace.steps)
    # accelerate infers a skip from whether step() ran: right for SGD, never for the fused
    # AdamW (whose step runs and skips inside), so the Trainer's schedule advances on those
    expected = [s.skipped for s in trace.steps] if optim == "sgd" else [False] * 40
    assert accelerate_says.skipped == expected
    assert trace.steps[0].grad_stats["count"] == 8 * 16 + 16 + 16 + 1
    assert trace.header.source.startswith("transformers ")
    report = replay(path, "torch")
    assert report.agree and report.steps_compared == 40, report
    planted = replay(path, "torch", growth_interval=4)
    assert not planted.agree and planted.divergence.fields == ("scale_after", "growth_tracker")


def test_trainer_without_a_scaler_is_refused(tmp_path):
    """On CPU accelerate gives Trainer(fp16=True) no GradScaler (and no autocast)."""
    trainer = make_trainer(ScalerTraceCallback(tmp_path / "none.jsonl"), 2, tmp_path,
                           optim="sgd")
    assert trainer.accelerator.scaler is None
    with pytest.raises(ValueError, match="without a GradScaler.*use_cpu_grad_scaler"):
        train(trainer)


def test_use_cpu_grad_scaler_needs_an_fp16_trainer(tmp_path):
    trainer = make_trainer(ScalerTraceCallback(tmp_path / "fp32.jsonl"), 2, tmp_path, optim="sgd",
                           fp16=False)
    with pytest.raises(ValueError, match="not fp16"):
        use_cpu_grad_scaler(trainer)


@pytest.mark.gpu
def test_fp16_trainer_on_cuda_is_recorded_and_agrees_with_the_torch_preset(tmp_path):
    """Trainer(fp16=True) on a CUDA device: accelerate's own GradScaler("cuda") with its
    defaults (2**16, growth every 2000 steps), the default fused AdamW."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False here")
    path = tmp_path / "hf-cuda.jsonl"
    trainer = make_trainer(ScalerTraceCallback(path), 40, tmp_path, optim="adamw_torch_fused",
                           use_cpu=False)
    train(trainer)
    assert trainer.accelerator.scaler is not None
    trace = read_trace(path)
    assert len(trace.steps) == 40 and "GradScaler('cuda')" in trace.header.source
    assert all(s.skipped == s.found_inf for s in trace.steps)
    report = replay(path, "torch")
    assert report.agree and report.steps_compared == 40, report
