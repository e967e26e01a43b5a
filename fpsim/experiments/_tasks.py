"""Shared tasks for experiments 3-6 (master weights, overflow, bf16, recipes).

Two tasks, both generated in code and seeded:

- ``regression_problem``: least squares ``y = x . w*`` with full-batch gradient descent on a
  single ``Linear`` layer. Inputs, true weights and targets are fp16 values, so every policy
  sees the same numbers and a model in fp16 *can* reach ``w*`` exactly; whatever stops it is
  the weight update, nothing else. Where updates are lost shows up crisply as a plateau.
- ``classification_split``: ``fpsim.train.make_dataset("teacher")`` (labels from a random
  two-layer network) split into a training and a held-out set, for an MLP trained by
  ``fpsim.train.train``.

``UpdateLog`` wraps an update rule and records, for every element update, the ratio
``|weight| / |intended update|`` and whether the stored weight changed: the data behind the
paper's "2048x" argument.

Determinism: every number these builders return comes from the bit-exact engine or from exact
arithmetic (``math.fsum`` of exact products, IEEE division and square root, comparisons against
exact powers of two); nothing goes through float64 BLAS or ``log2``. The one exception is the
teacher data set's labels, an ``argmax`` of a float64 BLAS product and ``tanh``: a label can only
depend on the machine where two class scores agree to ~1e-15, and ``teacher_label_margin``
(checked in the tests) shows the smallest gap is many orders of magnitude wider.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import backend
from ..autograd import Tensor, mse_loss, no_grad, use_policy
from ..nn import MLP, Linear
from ..optim import SGD, Optimizer
from ..rounding import round_to
from ..scaling import NoScaler
from ..train import Dataset, make_dataset

__all__ = ["Regression", "regression_problem", "RegressionRun", "run_regression", "UpdateLog",
           "classification_split", "teacher_label_margin", "build_mlp", "accuracy",
           "json_float", "first_stalled_step", "RATIO_EDGES", "PRECISION_BITS"]

# Significand bits (hidden bit included): an fp16 update is lost when it is below half an ulp
# of its weight, i.e. when |w| / |u| exceeds 2**11 = 2048 (w = 1.0) to 2**12 (w just below 2).
PRECISION_BITS = {"fp16": 11, "bf16": 8, "fp32": 24}

# Bin edges for |w| / |u|: four per octave at exact binary values 2**k * (1, 1.25, 1.5, 1.75),
# so binning is exact comparisons, the same on every machine.
RATIO_EDGES = np.array([2.0 ** k * m for k in range(0, 20) for m in (1.0, 1.25, 1.5, 1.75)]
                       + [2.0 ** 20])


# --- recording updates ---------------------------------------------------------------------
@dataclass
class UpdateLog:
    """An update rule that also records each element update: ``|w| / |intended|`` and whether
    the stored value stayed the same (a lost update). Behaves exactly like ``rule``."""

    rule: object
    ratios: list = field(default_factory=list, repr=False)
    lost: list = field(default_factory=list, repr=False)

    def init(self, param):
        return self.rule.init(param)

    def apply(self, ops, param, grad, state, step):
        result = self.rule.apply(ops, param, grad, state, step)
        before, after, intended = (backend.to_numpy(v).astype(np.float64).reshape(-1)
                                   for v in (param, result.param, result.intended))
        moved = intended != 0
        with np.errstate(divide="ignore", over="ignore"):
            self.ratios.append(np.abs(before[moved]) / np.abs(intended[moved]))
        self.lost.append(after[moved] == before[moved])
        return result

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.ratios:
            return np.zeros(0), np.zeros(0, bool)
        return np.concatenate(self.ratios), np.concatenate(self.lost)

    def window(self, bits: int) -> dict:
        """Updates and lost updates with ratio below ``2**bits``, within ``[2**bits,
        2**(bits+1)]`` and above ``2**(bits+1)``. Round to nearest with ``bits`` significand
        bits loses an update to a normal weight only if the ratio is at least ``2**bits`` and
        always loses it above ``2**(bits+1)``."""
        ratio, lost = self.arrays()
        low, high = 2.0 ** bits, 2.0 ** (bits + 1)
        parts = {"below": ratio < low, "within": (ratio >= low) & (ratio <= high),
                 "above": ratio > high}
        return {name: {"updates": int(mask.sum()), "lost": int((mask & lost).sum())}
                for name, mask in parts.items()}

    def binned(self) -> list[list]:
        """``[lower edge, updates, lost]`` for every ``RATIO_EDGES`` bin holding updates."""
        ratio, lost = self.arrays()
        index = np.searchsorted(RATIO_EDGES, ratio, side="right") - 1
        rows = []
        for b in range(len(RATIO_EDGES) - 1):
            mask = index == b
            if mask.any():
                rows.append([float(RATIO_EDGES[b]), int(mask.sum()), int((mask & lost).sum())])
        return rows


# --- the regression task -------------------------------------------------------------------
@dataclass(frozen=True)
class Regression:
    x: np.ndarray       # (n, features) float32 holding fp16 values
    y: np.ndarray       # (n, 1) float32 holding fp16 values
    w_star: np.ndarray  # (features,) float32 holding fp16 values, magnitudes in [1, 2)


def regression_problem(n: int = 256, features: int = 32, seed: int = 0) -> Regression:
    """Gaussian inputs, true weights of magnitude in [1, 2) with random signs, and targets
    ``fp16(exact x . w*)`` (products of fp16 values are exact in float64; ``math.fsum`` adds
    them exactly)."""
    rng = np.random.default_rng(seed)
    x = round_to(rng.standard_normal((n, features)).astype(np.float32), "fp16")
    w_star = round_to((rng.uniform(1.0, 2.0, features)
                       * rng.choice([-1.0, 1.0], features)).astype(np.float32), "fp16")
    w64 = w_star.astype(np.float64)
    exact = [math.fsum(row * w64) for row in x.astype(np.float64)]
    y = round_to(np.array(exact, np.float64), "fp16").astype(np.float32)[:, None]
    return Regression(x, y, w_star)


@dataclass
class RegressionRun:
    losses: np.ndarray          # float32, one a step: the loss the engine computed
    lost_fraction: np.ndarray   # per step: lost updates / attempted updates
    weight_error: np.ndarray    # per step, after the update: ||w - w*|| / ||w*||
    log: UpdateLog


def run_regression(problem: Regression, policy: str, master, lr: float, steps: int,
                   seed: int = 1) -> RegressionRun:
    """Full-batch gradient descent (SGD, no momentum) on ``Linear(features, 1, bias=False)``
    under ``policy``, with an fp32 master copy (``master="fp32"``) or none (``None``). No loss
    scaling: gradients here neither underflow nor overflow (a power-of-two scale leaves every
    bit the same), so the master copy is the only difference between runs."""
    features = problem.x.shape[1]
    with use_policy(policy):
        model = Linear(features, 1, bias=False, rng=seed)
    log = UpdateLog(SGD(lr=lr))
    optimizer = Optimizer(model, log, master=master)
    state = NoScaler().init()
    w_star = problem.w_star.astype(np.float64)
    norm_star = math.sqrt(math.fsum(w_star * w_star))
    losses, lost, error = [], [], []
    for _ in range(steps):
        with use_policy(policy):  # data enters in the policy's input format, as in train()
            loss = mse_loss(model(Tensor(problem.x)), Tensor(problem.y))
            loss.backward()
        report = optimizer.step(state)
        optimizer.zero_grad()
        state = report.scaler_state
        losses.append(loss.item())
        lost.append(report.lost_fraction)
        diff = model.weight.numpy().reshape(-1).astype(np.float64) - w_star  # exact
        error.append(math.sqrt(math.fsum(diff * diff)) / norm_star)
    return RegressionRun(np.array(losses, np.float32), np.array(lost), np.array(error), log)


def first_stalled_step(lost_fraction) -> int | None:
    """The first step from which every later update was lost (the run is frozen)."""
    stalled = None
    for step, fraction in enumerate(lost_fraction):
        if fraction == 1.0:
            stalled = step if stalled is None else stalled
        else:
            stalled = None
    return stalled


# --- the classification task ---------------------------------------------------------------
def classification_split(n_train: int = 8192, n_test: int = 2048, features: int = 16,
                         classes: int = 4, seed: int = 0) -> tuple[Dataset, Dataset]:
    """One teacher data set of ``n_train + n_test`` samples (one teacher network), split."""
    full = make_dataset("teacher", n=n_train + n_test, features=features, classes=classes,
                        seed=seed)
    train = Dataset(full.x[:n_train], full.y[:n_train], classes, "teacher-train")
    test = Dataset(full.x[n_train:], full.y[n_train:], classes, "teacher-test")
    return train, test


def teacher_label_margin(n: int = 8192 + 2048, features: int = 16, classes: int = 4,
                         seed: int = 0, hidden: int = 32) -> float:
    """The smallest gap between the top two teacher scores over the data set, relative to
    the largest score magnitude: how far each label is from depending on rounding."""
    rng = np.random.default_rng(seed)  # the same draws as fpsim.train.data._teacher
    x = rng.standard_normal((n, features))
    w1 = rng.standard_normal((features, hidden)) / np.sqrt(features)
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    scores = np.tanh(x @ w1 * 2.0) @ w2
    top = np.sort(scores, axis=1)
    return float(np.min((top[:, -1] - top[:, -2]) / np.max(np.abs(scores), axis=1)))


def build_mlp(policy: str, sizes=(16, 64, 4), seed: int = 0):
    """An MLP whose parameters are created in ``policy``'s parameter format (same draws for
    every policy: the float64 initial values are rounded once into that format)."""
    with use_policy(policy):
        return MLP(list(sizes), rng=seed)


def accuracy(model, policy: str, data: Dataset) -> tuple[float, float]:
    """Held-out accuracy with the model evaluated under ``policy`` (no gradients), and the
    fraction of samples whose logits are not all finite; those count as wrong."""
    with use_policy(policy), no_grad(), np.errstate(invalid="ignore", over="ignore"):
        logits = model(Tensor(data.x)).numpy()
    finite = np.isfinite(logits).all(axis=1)
    correct = finite & (np.argmax(np.where(np.isfinite(logits), logits, -np.inf), axis=1)
                        == data.y)
    return float(correct.mean()), float(1.0 - finite.mean())


def json_float(value: float):
    """A float for ``Result.numbers``: finite values as they are, NaN/inf as strings (JSON has
    no literal for them)."""
    value = float(value)
    return value if math.isfinite(value) else repr(value)
