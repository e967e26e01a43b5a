"""Training data: a validated ``Dataset`` and built-in data sets generated in code (seeded;
nothing is downloaded).

>>> data = make_dataset("blobs", n=256, features=8, classes=4, seed=0)
>>> data.x.shape, data.x.dtype, data.classes, int(data.y.max())
((256, 8), dtype('float32'), 4, 3)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "make_dataset", "DATASETS"]


@dataclass(frozen=True)
class Dataset:
    """Inputs ``x`` (float32, ``(n, features)``) and integer class labels ``y`` (``(n,)``)."""

    x: np.ndarray
    y: np.ndarray
    classes: int
    name: str = "data"

    def __post_init__(self) -> None:
        if isinstance(self.classes, bool) or not isinstance(self.classes, (int, np.integer)) \
                or self.classes < 1:
            raise ValueError(f"{self.name}: classes must be a positive integer, got "
                             f"{self.classes!r}")
        x, y = np.asarray(self.x), np.asarray(self.y)
        if x.ndim != 2:
            raise ValueError(f"{self.name}: inputs must be 2-D (samples, features), got shape "
                             f"{x.shape}")
        if x.dtype.kind != "f":
            raise TypeError(f"{self.name}: inputs must be floating point, got {x.dtype}")
        bad = ~np.isfinite(x)
        if bad.any():
            row, col = map(int, np.argwhere(bad)[0])
            raise ValueError(f"{self.name}: inputs hold {int(bad.sum())} NaN/inf value(s), the "
                             f"first at sample {row}, feature {col}; clean the data first")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"{self.name}: labels must have shape ({x.shape[0]},) to match "
                             f"inputs {x.shape}, got {y.shape}")
        if y.dtype.kind not in "iu":
            raise TypeError(f"{self.name}: labels must be integers, got {y.dtype}")
        if y.size and (y.min() < 0 or y.max() >= self.classes):
            raise ValueError(f"{self.name}: labels must lie in 0..{self.classes - 1}, got "
                             f"{int(y.min())}..{int(y.max())}")
        with np.errstate(over="ignore"):
            x32 = np.ascontiguousarray(x, np.float32)
        beyond = ~np.isfinite(x32)
        if beyond.any():
            row, col = map(int, np.argwhere(beyond)[0])
            raise ValueError(f"{self.name}: {int(beyond.sum())} input value(s) overflow float32 "
                             f"(|x| > 3.4e38), the first at sample {row}, feature {col} "
                             f"({float(x[row, col])!r}); scale the data first")
        object.__setattr__(self, "x", x32)
        object.__setattr__(self, "y", np.ascontiguousarray(y, np.int64))

    @property
    def features(self) -> int:
        return self.x.shape[1]

    def __len__(self) -> int:
        return self.x.shape[0]


def _blobs(rng, n, features, classes, spread=1.0):
    centers = rng.standard_normal((classes, features)) * 3.0
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.standard_normal((n, features)) * spread
    return x, y


def _spirals(rng, n, features, classes, noise=0.15):
    if features < 2:
        raise ValueError("spirals needs features >= 2")
    y = rng.integers(0, classes, n)
    t = rng.random(n) * 3.0 + 0.3
    angle = t * 1.75 + y * (2 * np.pi / classes)
    x = np.zeros((n, features))
    x[:, 0] = t * np.cos(angle) + rng.standard_normal(n) * noise
    x[:, 1] = t * np.sin(angle) + rng.standard_normal(n) * noise
    x[:, 2:] = rng.standard_normal((n, features - 2)) * noise
    return x, y


def _teacher(rng, n, features, classes, hidden=32):
    """Labels from a random two-layer tanh network: learnable, but not linearly separable."""
    x = rng.standard_normal((n, features))
    w1 = rng.standard_normal((features, hidden)) / np.sqrt(features)
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    y = np.argmax(np.tanh(x @ w1 * 2.0) @ w2, axis=1)
    return x, y


DATASETS = {"blobs": _blobs, "spirals": _spirals, "teacher": _teacher}


def make_dataset(name: str, n: int = 2048, features: int = 16, classes: int = 4,
                 seed: int = 0) -> Dataset:
    """A built-in data set: ``"blobs"`` (Gaussian clusters), ``"spirals"`` (interleaved
    spirals in the first two features) or ``"teacher"`` (labels from a random network)."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; built-in: {', '.join(DATASETS)}")
    for label, value, low in (("n", n, 1), ("features", features, 1), ("classes", classes, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    rng = np.random.default_rng(seed)
    x, y = DATASETS[name](rng, n, features, classes)
    return Dataset(x.astype(np.float32), y.astype(np.int64), classes, name)
