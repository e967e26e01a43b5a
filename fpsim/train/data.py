"""Training data: a validated ``Dataset`` and built-in data sets generated in code (seeded;
nothing is downloaded).

>>> data = make_dataset("blobs", n=256, features=8, classes=4, seed=0)
>>> data.x.shape, data.x.dtype, data.classes, int(data.y.max())
((256, 8), dtype('float32'), 4, 3)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..options import check_count

__all__ = ["Dataset", "make_dataset", "DATASETS"]


@dataclass(frozen=True)
class Dataset:
    """Inputs ``x`` and targets ``y``, one sample per leading index.

    - ``x``: float (stored as float32) of any shape ``(n, ...)``: feature rows ``(n, f)``,
      images ``(n, C, H, W)``, sequences of vectors; or integer token ids ``(n, ...)`` (for
      models that start with an ``Embedding``; stored as int64).
    - ``y`` with ``classes`` (a classification): integer labels ``(n,)``, or one label per
      position ``(n, ...)`` (per-token targets), each in ``0..classes-1``.
    - ``y`` with ``classes=None`` (a regression): float targets ``(n, ...)``, stored as
      float32.
    """

    x: np.ndarray
    y: np.ndarray
    classes: "int | None" = None
    name: str = "data"

    def __post_init__(self) -> None:
        x, y = np.asarray(self.x), np.asarray(self.y)
        if x.ndim < 1 or x.shape[0] < 1:
            raise ValueError(f"{self.name}: inputs must hold at least one sample (n, ...), got "
                             f"shape {x.shape}")
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{self.name}: inputs must be floating point (features, images) or "
                            f"integer (token ids), got {x.dtype}")
        if y.ndim < 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"{self.name}: labels/targets must have shape ({x.shape[0]},) or "
                             f"({x.shape[0]}, ...) to match inputs {x.shape}, got {y.shape}")
        object.__setattr__(self, "x", _inputs(self.name, x))
        object.__setattr__(self, "y", self._targets(y))

    def _targets(self, y: np.ndarray) -> np.ndarray:
        if self.classes is None:
            return _regression_targets(self.name, y)
        return _labels(self.name, y, self.classes)

    def check(self) -> "Dataset":
        """Check the arrays again as construction did, and return self: they are NumPy
        arrays, so a NaN or a label written into them later would pass unseen (``train``
        calls this before its first step; one pass over the data, no copy)."""
        try:
            _inputs(self.name, self.x)
            self._targets(self.y)
        except (ValueError, TypeError) as err:
            raise type(err)(f"{err} (written into the Dataset after it was built)") from None
        return self

    @property
    def features(self) -> int:
        """The size of one sample's last axis (the feature count of ``(n, f)`` data)."""
        return self.x.shape[-1]

    @property
    def task(self) -> str:
        """"classification" (integer labels and ``classes``) or "regression"."""
        return "regression" if self.classes is None else "classification"

    def __len__(self) -> int:
        return self.x.shape[0]


def _first_bad(bad: np.ndarray) -> str:
    """"3 value(s), the first at sample 3, feature 5" (or "position (1, 2)" beyond 2-D)."""
    sample, *rest = map(int, np.argwhere(bad)[0])
    at = (f", feature {rest[0]}" if len(rest) == 1 else
          f", position {tuple(rest)}" if rest else "")
    return f"the first at sample {sample}{at}"


def _inputs(name: str, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        too_large = x > np.iinfo(np.int64).max if x.dtype == np.uint64 else None
        if too_large is not None and too_large.any():      # int64 would wrap them negative
            raise ValueError(f"{name}: integer inputs are token ids and must fit int64 (at most "
                             f"2**63 - 1); {int(too_large.sum())} value(s) are larger, "
                             f"{_first_bad(too_large)}")
        if x.size and x.min() < 0:
            raise ValueError(f"{name}: integer inputs are token ids and must be >= 0; "
                             f"{int((x < 0).sum())} negative value(s), {_first_bad(x < 0)}")
        return np.ascontiguousarray(x, np.int64)
    return _finite_float32(name, x, "input")


def _finite_float32(name: str, values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as float32, refused where one is NaN/inf or overflows float32."""
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"{name}: {what}s hold {int(bad.sum())} NaN/inf value(s), "
                         f"{_first_bad(bad)}; clean the data first")
    with np.errstate(over="ignore"):
        values32 = np.ascontiguousarray(values, np.float32)
    beyond = ~np.isfinite(values32)
    if beyond.any():
        raise ValueError(f"{name}: {int(beyond.sum())} {what} value(s) overflow float32 "
                         f"(|x| > 3.4e38), {_first_bad(beyond)}; scale the data first")
    return values32


def _labels(name: str, y: np.ndarray, classes) -> np.ndarray:
    try:
        check_count(f"{name}: classes", classes, 2)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{err} (a classification needs two classes or more; give "
                        f"classes=None for regression targets)") from None
    if y.dtype.kind not in "iu":
        raise TypeError(f"{name}: labels must be integers (or give classes=None for float "
                        f"regression targets), got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise ValueError(f"{name}: labels must lie in 0..{classes - 1}, got "
                         f"{int(y.min())}..{int(y.max())}")
    return np.ascontiguousarray(y, np.int64)


def _regression_targets(name: str, y: np.ndarray) -> np.ndarray:
    if y.dtype.kind != "f":
        raise TypeError(f"{name}: without classes the targets are regression values and must "
                        f"be floating point, got {y.dtype} (give classes= for labels)")
    return _finite_float32(name, y, "target")


def _blobs(rng, n, features, classes, spread=1.0):
    centers = rng.standard_normal((classes, features)) * 3.0
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.standard_normal((n, features)) * spread
    return x, y, classes


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
    return x, y, classes


def _teacher(rng, n, features, classes, hidden=32):
    """Labels from a random two-layer tanh network: learnable, but not linearly separable."""
    x = rng.standard_normal((n, features))
    w1 = rng.standard_normal((features, hidden)) / np.sqrt(features)
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    y = np.argmax(np.tanh(x @ w1 * 2.0) @ w2, axis=1)
    return x, y, classes


def _images(rng, n, features, classes, size=12, channels=1, noise=1.0):
    """Images (n, channels, size, size): one smooth random template per class (a 3x3 box
    average of Gaussian pixels), each sample its class's template plus N(0, noise**2) pixels."""
    raw = rng.standard_normal((classes, channels, size + 2, size + 2))
    templates = sum(raw[..., i:i + size, j:j + size] for i in range(3) for j in range(3)) / 3.0
    y = rng.integers(0, classes, n)
    return templates[y] + rng.standard_normal((n, channels, size, size)) * noise, y, classes


def _tokens(rng, n, features, classes, length=16):
    """Token sequences (n, length) over a vocabulary of ``classes`` ids, one label per
    token: the sum of the token and the one before it, modulo the vocabulary (the first
    token's predecessor is 0), so a model must look back one position."""
    x = rng.integers(0, classes, (n, length))
    before = np.concatenate([np.zeros((n, 1), np.int64), x[:, :-1]], axis=1)
    return x, (x + before) % classes, classes


DATASETS = {"blobs": _blobs, "spirals": _spirals, "teacher": _teacher, "images": _images,
            "tokens": _tokens}
# the keyword arguments each built-in data set takes (--data-arg), with the least they accept
OPTIONS = {"images": {"size": 1, "channels": 1, "noise": 0.0}, "tokens": {"length": 1}}


def make_dataset(name: str, n: int = 2048, features: int = 16, classes: int = 4,
                 seed: int = 0, **options) -> Dataset:
    """A built-in data set: ``"blobs"`` (Gaussian clusters), ``"spirals"`` (interleaved
    spirals in the first two features), ``"teacher"`` (labels from a random network), all
    ``(n, features)``; ``"images"`` (``(n, channels, size, size)``, options ``size=12``,
    ``channels=1``, ``noise=1.0``); ``"tokens"`` (``(n, length)`` ids over a vocabulary of
    ``classes``, a label per token; option ``length=16``)."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; built-in: {', '.join(DATASETS)}")
    for label, value, low in (("n", n, 1), ("features", features, 1), ("classes", classes, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    accepted = OPTIONS.get(name, {})
    for key, value in options.items():
        if key not in accepted:
            raise ValueError(f"data set {name!r} takes "
                             f"{', '.join(accepted) or 'no options'}; got {key!r}")
        whole = isinstance(accepted[key], int)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer) if whole else
                                                       (int, float, np.number)) \
                or not value >= accepted[key] or (not whole and not np.isfinite(value)):
            kind = "an integer" if whole else "a finite number"
            raise ValueError(f"data set {name!r}: {key} must be {kind} >= {accepted[key]}, "
                             f"got {value!r}")
    rng = np.random.default_rng(seed)
    x, y, classes = DATASETS[name](rng, n, features, classes, **options)
    x = x if x.dtype.kind in "iu" else x.astype(np.float32)
    return Dataset(x, y.astype(np.int64), classes, name)
