"""A real Lightning fit in fp16 mixed precision on CPU, recorded by ScalerTraceCallback and
replayed through the torch preset.

Optional: skipped without lightning (not installed by CI). To run it:
``pip install --no-deps lightning==2.6.6 lightning-utilities torchmetrics && python -m pytest
tests/test_conformance_lightning.py``."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="Lightning needs torch")
L = pytest.importorskip("lightning.pytorch", reason="lightning not installed: pip install "
                        "--no-deps lightning==2.6.6 lightning-utilities torchmetrics")

from lightning.pytorch.plugins.precision import MixedPrecision  # noqa: E402

from fpsim.conformance import read_trace, replay  # noqa: E402
from fpsim.conformance.lightning_recorder import ScalerTraceCallback  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def fit(callback, steps=60, **trainer_kwargs):
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    data = torch.utils.data.TensorDataset(x, x[:, :1] * 3.0 + 1.0)
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # Lightning's advice on workers and logging
        trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=32))


def test_fp16_mixed_fit_is_recorded_and_agrees_with_the_torch_preset(tmp_path):
    """From 2**24 the fp16 gradients overflow for 8 steps, then the scale see-saws between
    2**16 and 2**17 (growth every 3 clean steps, overflow at 2**17): real overflows."""
    path = tmp_path / "lightning.jsonl"
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=3)
    fit(ScalerTraceCallback(path), plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    trace = read_trace(path)
    assert len(trace.steps) == 60 and sum(s.found_inf for s in trace.steps) >= 10
    assert any(not s.found_inf for s in trace.steps)
    assert all(s.skipped == s.found_inf for s in trace.steps)
    assert trace.steps[0].grad_stats["count"] == 8 * 16 + 16 + 16 + 1
    assert trace.header.source.startswith("lightning ")
    report = replay(path, "torch")
    assert report.agree and report.steps_compared == 60, report
    planted = replay(path, "torch", growth_interval=4)
    assert not planted.agree and planted.divergence.fields == ("scale_after", "growth_tracker")


def test_precision_16_mixed_on_cpu_has_no_scaler_and_is_refused(tmp_path):
    """Lightning 2.6 turns precision="16-mixed" on CPU into bf16-mixed (no GradScaler)."""
    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU"), \
            pytest.raises(ValueError, match="has no GradScaler"):
        fit(ScalerTraceCallback(tmp_path / "none.jsonl"), steps=2, precision="16-mixed")
