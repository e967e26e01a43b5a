"""Experiment: a small residual CNN's activation gradients against fp16's range (the paper's
Fig. 3 comes from a CNN, the SSD detector), and its training under the precision recipes.

The network (``ResidualCNN``): a 3x3 convolution from the image's one channel to 8, two
residual blocks ``x -> relu(x + conv(relu(conv(x))))`` (3x3, 8 channels, size kept), global
average pooling and a linear read-out to 4 classes, PyTorch's default initialisation. The data
are ``make_dataset("images")`` at 8x8 pixels: one smooth random template per class plus
Gaussian noise (std 0.5); seeded draws and elementwise float64 arithmetic, so the same bits on
every machine. Adam (lr 1e-2), batch 64.

Five runs from the same weights on the same batches: fp32 ("32-true"), "16-mixed" without
loss scaling, with a static scale of 128 and with torch's dynamic GradScaler, and "bf16-mixed".
Before and after the fp32 run, every convolution's output and the logits retain their gradient
over four batches; those fp32 values are judged against fp16 exactly, as in the underflow
experiment (``underflow.judge``). Two numbers say what the lost values are: the share of the
gradient's magnitude (sum of |g|, exact) they carry, and the share that belongs to samples the
network already fits (right-class probability above 1 - 2**-7; read off the logits' gradient,
which is (p - onehot) / 64 for the mean cross-entropy, so no transcendental function is needed).
"""
from __future__ import annotations

import math

import numpy as np

from .. import nn
from ..autograd import Tensor, cross_entropy, use_policy
from ..optim import Adam, Optimizer
from ..plots.cnn import plot_cnn
from ..train import Dataset, make_dataset, train
from . import Context, Result, register
from .loss_curves import median, typical_gap
from .underflow import LOST_MAX, exponent_histogram, judge, layer_quantiles

TITLE = "CNN: a residual network's activation gradients and the precision recipes"
SIZE, CHANNELS, BLOCKS, CLASSES, NOISE = 8, 8, 2, 4, 0.5
SAMPLES, BATCH, LR = 2048, 64, 1e-2
RECORDED_BATCHES = 4
FIT_ERROR = 2.0 ** -7     # a sample is fit when 1 - p(right class) is below this
STATIC_SCALE = 128
TRACKING = 3.0
RUNS = {  # label: (policy, scaler)
    "fp32 (32-true)": ("32-true", "none"),
    "16-mixed, no loss scaling": ("16-mixed", "none"),
    f"16-mixed, loss scale {STATIC_SCALE}": ("16-mixed", f"static:{STATIC_SCALE}"),
    "16-mixed, dynamic scaling (torch)": ("16-mixed", "dynamic"),
    "bf16-mixed": ("bf16-mixed", "none"),
}
LAYERS = ["stem"] + [f"block {b + 1} conv {c + 1}" for b in range(BLOCKS) for c in (0, 1)] \
    + ["logits"]
MODEL = (f"3x3 conv 1->{CHANNELS}, {BLOCKS} residual blocks of two 3x3 convs, "
         f"global average pooling, linear {CHANNELS}->{CLASSES}")

__all__ = ["ResidualBlock", "ResidualCNN", "images", "record_activation_gradients",
           "what_is_lost", "RUNS", "LAYERS", "run"]


class ResidualBlock(nn.Module):
    """``relu(x + conv2(relu(conv1(x))))``, both convolutions 3x3 keeping the size."""

    def __init__(self, channels: int, rng):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, rng=rng)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, rng=rng)

    def forward(self, x, watched: list | None = None):
        h = _watch(self.conv1(x), watched)
        return (x + _watch(self.conv2(h.relu()), watched)).relu()


class ResidualCNN(nn.Module):
    """Stem convolution, ``blocks`` residual blocks, global average pooling, linear read-out.
    ``forward(x, watched)`` appends every convolution's output and the logits, each retaining
    its gradient, to ``watched`` when it is a list."""

    def __init__(self, size: int = SIZE, channels: int = CHANNELS, blocks: int = BLOCKS,
                 classes: int = CLASSES, seed: int = 0):
        super().__init__()
        rng = nn.init.as_rng(seed)
        self.stem = nn.Conv2d(1, channels, 3, padding=1, rng=rng)
        self.blocks = nn.ModuleList(ResidualBlock(channels, rng) for _ in range(blocks))
        self.pool = nn.AvgPool2d(size)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(channels, classes, rng=rng)

    def forward(self, x, watched: list | None = None):
        x = _watch(self.stem(x), watched).relu()
        for block in self.blocks:
            x = block(x, watched)
        return _watch(self.head(self.flatten(self.pool(x))), watched)


def _watch(t: Tensor, watched: list | None) -> Tensor:
    """``t``, kept (retaining its gradient) in ``watched`` when that is a list."""
    if watched is not None:
        watched.append(t.retain_grad())
    return t


def images() -> Dataset:
    """The experiment's data: 2048 8x8 one-channel images of 4 classes (seed 0)."""
    return make_dataset("images", n=SAMPLES, classes=CLASSES, seed=0, size=SIZE, noise=NOISE)


def record_activation_gradients(model: ResidualCNN, data: Dataset, *,
                                batches: int = RECORDED_BATCHES, seed: int = 1):
    """fp32 gradients of every convolution's output and of the logits (mean cross-entropy),
    per layer in ``LAYERS`` order, each an array (samples, values per sample) over ``batches``
    random batches of ``BATCH``."""
    rng = np.random.default_rng(seed)
    per_layer: list[list[np.ndarray]] = []
    with use_policy("32-true"):
        for _ in range(batches):
            idx = rng.integers(0, len(data), BATCH)
            watched: list = []
            cross_entropy(model(Tensor(data.x[idx]), watched), data.y[idx]).backward()
            model.zero_grad()
            per_layer = per_layer or [[] for _ in watched]
            for store, t in zip(per_layer, watched):
                store.append(t.grad.numpy().astype(np.float32).reshape(BATCH, -1))
    return [np.concatenate(parts) for parts in per_layer]


def what_is_lost(per_layer) -> dict:
    """Of the nonzero values fp16 loses (|g| <= 2**-25): the share of the total sum of |g|
    they carry (exact sums), and the share belonging to fit samples (1 - p(right class) <
    ``FIT_ERROR``, read from the logits' gradient), against the share of samples that are fit."""
    logits_grad = per_layer[-1].astype(np.float64) * BATCH        # p - onehot, exactly
    fit = np.max(np.abs(logits_grad), axis=1) < FIT_ERROR
    everything = np.concatenate([g.reshape(-1) for g in per_layer])
    lost_rows = [(g != 0) & (np.abs(g) <= LOST_MAX) for g in per_layer]
    lost = np.concatenate([m.reshape(-1) for m in lost_rows])
    magnitude = np.abs(everything).astype(np.float64)
    n_lost = int(np.count_nonzero(lost))
    from_fit = sum(int(np.count_nonzero(m[fit])) for m in lost_rows)
    return {"lost_share_of_gradient_magnitude": math.fsum(magnitude[lost])
            / math.fsum(magnitude),
            "lost_values_from_fit_samples": from_fit / n_lost if n_lost else 0.0,
            "fit_samples": float(np.mean(fit))}


def gradients_report(per_layer) -> dict:
    """What the recorded gradients show: ``underflow.judge``'s counts and fractions, the
    exponent histogram, per-layer quantiles and lost fractions, and ``what_is_lost``."""
    everything = np.concatenate([g.reshape(-1) for g in per_layer])
    verdict = judge(everything)
    return {"counts": verdict["counts"], "fractions": verdict["fractions"],
            "histogram": exponent_histogram(everything),
            "layer_abs_quantiles_10_50_90": layer_quantiles([g.reshape(-1)
                                                             for g in per_layer]),
            "layer_lost_of_nonzero": [judge(g.reshape(-1))["fractions"]["lost_of_nonzero"]
                                      for g in per_layer],
            **what_is_lost(per_layer)}


def train_one(policy: str, scaler: str, steps: int, data: Dataset) -> tuple[dict, ResidualCNN]:
    """One run from the seed-0 weights on the seed-0 batches; its numbers and the model."""
    model = ResidualCNN()
    result = train(model, data, optimizer=Optimizer(model, Adam(lr=LR)), policy=policy,
                   scaler=scaler, steps=steps, batch_size=BATCH, seed=0, progress=False)
    records = result.records
    losses = [float(r.loss) for r in records]
    tail = max(1, steps // 10)
    underflow = [float(r.underflow_fraction) for r in records]
    return {"policy": policy, "scaler": scaler, "losses": losses,
            "loss_sha256": result.loss_hash, "underflow_fraction": underflow,
            "final_loss": median(losses[-tail:]),
            "mean_underflow_fraction": math.fsum(underflow) / steps,
            "final_underflow_fraction": math.fsum(underflow[-tail:]) / tail,
            "skipped_steps": int(sum(r.skipped for r in records)),
            "skipped_at": [r.step for r in records if r.skipped],
            "final_scale": float(result.scaler_state.scale),
            "mean_lost_update_fraction": math.fsum(float(r.lost_update_fraction)
                                                   for r in records) / steps}, model


@register("cnn", TITLE)
def run(ctx: Context) -> Result:
    steps = 16 if ctx.quick else 80
    data = images()
    ctx.progress(f"cnn: activation gradients at initialisation ({RECORDED_BATCHES} batches)")
    at_init = gradients_report(record_activation_gradients(ResidualCNN(), data))
    runs = {}
    for label, (policy, scaler) in RUNS.items():
        ctx.progress(f"cnn: {label}, {steps} steps")
        runs[label], model = train_one(policy, scaler, steps, data)
        if policy == "32-true":
            trained = gradients_report(record_activation_gradients(model, data))
    fp32 = runs[next(iter(RUNS))]
    for r in runs.values():
        r["final_gap_to_fp32"] = r["final_loss"] - fp32["final_loss"]
        r["typical_gap_to_fp32"] = typical_gap(r["losses"], fp32["losses"])
    figures = plot_cnn(at_init, trained, runs, LAYERS, ctx.out / "cnn")
    numbers = {"model": MODEL, "data": f"images {SIZE}x{SIZE}, {CLASSES} classes, noise "
               f"{NOISE}, {SAMPLES} samples", "optimizer": f"Adam lr {LR}", "batch": BATCH,
               "steps": steps, "layers": LAYERS, "fit_error_below": FIT_ERROR,
               "gradients_at_init": at_init, "gradients_after_fp32_training": trained,
               "runs": runs}
    return Result("cnn", TITLE, numbers, [p.name for p in figures], _summary(numbers),
                  _table(numbers))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _table(numbers: dict) -> str:
    rows = ["| run | final loss | gap to fp32: final / typical | gradient values flushed to 0 "
            "(mean / last 10% of steps) | skipped steps | final scale |",
            "|---|---|---|---|---|---|"]
    for label, r in numbers["runs"].items():
        rows.append(f"| {label} | {r['final_loss']:.4f} | {r['final_gap_to_fp32']:+.4f} / "
                    f"{r['typical_gap_to_fp32']:.4f} | {_pct(r['mean_underflow_fraction'])} / "
                    f"{_pct(r['final_underflow_fraction'])} | {r['skipped_steps']} | "
                    f"{r['final_scale']:g} |")
    return "\n".join(rows)


def _summary(numbers: dict) -> str:
    """The paragraph of ``summary.md``, every claim read from ``numbers``."""
    init, done = numbers["gradients_at_init"], numbers["gradients_after_fp32_training"]
    fi, fd = init["fractions"], done["fractions"]
    runs = list(numbers["runs"].values())
    fp32, none, static, dynamic, bf16 = runs
    steps, tail = numbers["steps"], max(1, numbers["steps"] // 10)
    recovered = " / ".join(_pct(fd["by_scale"][s]["recovered_of_lost"])
                           for s in ("8", "128", "32768"))
    # A run tracks fp32 when its typical gap is within TRACKING times that of the static-scale
    # and bf16 runs, which neither underflow much nor skip: rounding alone sends runs down
    # slightly different paths, and that much distance is noise.
    scaled_gap = TRACKING * max(r["typical_gap_to_fp32"] for r in (static, bf16))
    verdict = "does not lag" if none["typical_gap_to_fp32"] <= scaled_gap else "lags"
    last = f"last {tail} steps" if tail > 1 else "last step"
    text = (
        f"A residual CNN ({numbers['model']}) on generated 8x8 images of four classes, Adam "
        f"(lr {LR}), batch {BATCH}, {steps} steps per run from the same weights on the same "
        f"batches (final loss: median of the {last}; typical gap: median distance "
        f"of the 10-step means to fp32's). Activation gradients (every convolution's output "
        f"and the logits, {done['counts']['values']:,} values over {RECORDED_BATCHES} "
        f"batches) recorded in fp32: at initialisation {_pct(fi['lost_of_nonzero'])} of the "
        f"nonzero values round to zero in fp16 but {_pct(fi['subnormal_of_nonzero'])} are "
        f"already fp16 subnormals, because the mean over {BATCH} samples and the average "
        f"pooling over {SIZE * SIZE} positions divide every convolution's gradient by "
        f"{BATCH * SIZE * SIZE}. After fp32 training {_pct(fd['lost_of_nonzero'])} are lost "
        f"and {_pct(fd['subnormal_of_nonzero'])} subnormal; only "
        f"{_pct(fd['normal_of_nonzero'])} are normal fp16 numbers (left panels). Loss scales "
        f"of 8 / 128 / 32768 recover {recovered} of the lost values, none overflowing. The "
        f"underflow grows as the network fits: {_pct(done['lost_values_from_fit_samples'])} "
        f"of the lost values belong to the {_pct(done['fit_samples'])} of samples it already "
        f"classifies with p(right class) > 1 - 2^-7, whose gradients shrink with their error, "
        f"and all lost values together carry "
        f"{100 * done['lost_share_of_gradient_magnitude']:.2g}% of the gradients' summed "
        f"magnitude. So fp16 without loss scaling {verdict} here: in backward it flushes "
        f"{_pct(none['final_underflow_fraction'])} of the nonzero gradient values to zero over "
        f"the {last} (scale {STATIC_SCALE}: "
        f"{_pct(static['final_underflow_fraction'])}; bf16, with fp32's range: "
        f"{_pct(bf16['final_underflow_fraction'])}), yet it ends at {none['final_loss']:.4f} "
        f"against fp32's {fp32['final_loss']:.4f} (typical gap "
        f"{none['typical_gap_to_fp32']:.4f}; scale {STATIC_SCALE}: "
        f"{static['typical_gap_to_fp32']:.4f}, final {static['final_loss']:.4f}; bf16-mixed: "
        f"{bf16['typical_gap_to_fp32']:.4f}, final {bf16['final_loss']:.4f}). What fp16 "
        f"drops is the gradient of samples already learnt, not the signal that is still "
        f"learning; the paper, too, reports its ImageNet classification CNNs training without "
        f"loss scaling, and needed a scale for the SSD detector of its Fig. 3. Underflow "
        f"stalls training when the lost values are the whole signal of some layers, as in the "
        f"loss-curves experiment. Every run updates fp32 master weights, so rounding loses "
        f"next to no update: {_lost_updates(runs)}.")
    return text + _dynamic_sentence(dynamic, fp32, scaled_gap)


def _lost_updates(runs: list) -> str:
    worst = max(r["mean_lost_update_fraction"] for r in runs)
    if not worst:
        return "no element a step meant to move stayed put, in any run"
    return (f"at most {100 * worst:.2g}% of the elements a step meant to move stayed put, "
            f"averaged over a run's steps")


def _dynamic_sentence(dynamic: dict, fp32: dict, scaled_gap: float) -> str:
    """Torch's scaler: where it skipped and what that did to its curve."""
    gap = dynamic["typical_gap_to_fp32"]
    if not dynamic["skipped_steps"]:
        return (f" Torch's dynamic scaler stays at {dynamic['final_scale']:g} without a "
                f"skipped step (typical gap {gap:.4f}).")
    at = ", ".join(map(str, dynamic["skipped_at"]))
    skips = (f" Torch's dynamic scaler starts at 65536, where its largest scaled gradients "
             f"overflow fp16: it skips step{'s' if dynamic['skipped_steps'] > 1 else ''} {at} "
             f"and backs off to {dynamic['final_scale']:g}")
    if gap <= scaled_gap:
        return f"{skips}, and tracks fp32 too (typical gap {gap:.4f})."
    first = dynamic["skipped_at"][0]
    peak = max(range(first, len(fp32["losses"])), key=lambda i: (fp32["losses"][i], -i))
    bumpy = (f" through Adam's bumpy early phase (fp32's own loss rises from "
             f"{fp32['losses'][first]:.2f} at step {first} to {fp32['losses'][peak]:.2f} at step "
             f"{peak})" if peak > first else "")
    return (f"{skips}. A skipped step drops its batch, so from the first skip on this run "
            f"follows another path{bumpy}: typical gap {gap:.4f}, final loss "
            f"{dynamic['final_loss']:.4f}. The static scale rounds the same way without "
            f"skipping and tracks fp32, so that difference is the skipped batches'.")
