"""What the trainer minimises, and how a batch reaches the model.

``resolve_loss(spec, data)`` gives ``(loss(output, targets) -> scalar Tensor, its name)``:

- ``"cross_entropy"``: class logits ``(batch, ..., classes)`` against integer labels
  ``(batch, ...)``. With one label per position (token sequences, ``(batch, length)``) the
  logits are flattened to ``(batch * length, classes)`` and the loss is the mean over every
  position, as ``torch.nn.functional.cross_entropy`` gives for ``(N, C, L)`` logits.
- ``"mse"``: mean squared error of the output against float targets of its shape (the
  targets enter as a ``Tensor`` in the policy's input format, as data does).
- a function of (output, targets) returning a one-element ``Tensor``: named by its module and
  qualified name in ``run.json``.
- ``"auto"``: cross-entropy for labelled data, mse for regression targets.

``batch_inputs(x)``: float inputs become a ``Tensor`` (the policy's input format); integer
inputs (token ids) stay an integer array on the backend, which ``nn.Embedding`` takes.

>>> import numpy as np
>>> from fpsim.train import Dataset
>>> data = Dataset(np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32))
>>> resolve_loss("auto", data)[1]
'mse'
"""
from __future__ import annotations

from .. import backend
from ..autograd import Tensor, cross_entropy, mse_loss, reshape
from ..backend import xp
from .data import Dataset

__all__ = ["resolve_loss", "batch_inputs", "LOSSES"]

LOSSES = ("auto", "cross_entropy", "mse")


def batch_inputs(x):
    """A batch of inputs as the model takes it: a ``Tensor`` of float data, or the integer
    token ids as a backend array."""
    if backend.isdtype(x.dtype, "integral"):
        return backend.asarray(x, xp.int64)
    return Tensor(x)


def _cross_entropy(output, labels, classes: int):
    """Cross-entropy over the last axis of ``output``, one label per leading position."""
    labels = backend.asarray(labels, xp.int64)
    if output.ndim != labels.ndim + 1 or tuple(output.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"cross_entropy: the model's output {tuple(output.shape)} must be "
                         f"the labels' shape {tuple(labels.shape)} plus a class axis")
    if output.shape[-1] != classes:
        raise ValueError(f"the model gives {output.shape[-1]} class scores per label, but the "
                         f"data has {classes} classes: its output must be (batch, ..., "
                         f"{classes})")
    if output.ndim > 2:
        output = reshape(output, (-1, output.shape[-1]))
        labels = xp.reshape(labels, (-1,))
    return cross_entropy(output, labels)


def _mse(output, targets):
    if tuple(output.shape) != tuple(targets.shape):
        raise ValueError(f"mse: the model's output {tuple(output.shape)} and the targets "
                         f"{tuple(targets.shape)} must have one shape")
    return mse_loss(output, Tensor(targets))


def resolve_loss(spec, data: Dataset):
    """``(loss function, name)`` for ``spec`` (see the module docstring); a name that does
    not fit the data (cross-entropy of regression targets, mse of labels) is refused."""
    if callable(spec):
        return spec, f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', spec)}"
    if not isinstance(spec, str) or spec.strip().lower() not in LOSSES + ("mse_loss",):
        raise ValueError(f"unknown loss {spec!r}; give one of {', '.join(LOSSES)} or a "
                         f"function loss(output, targets) returning a scalar Tensor")
    name = spec.strip().lower().removesuffix("_loss")
    if name == "auto":
        name = "cross_entropy" if data.task == "classification" else "mse"
    if name == "cross_entropy" and data.task != "classification":
        raise ValueError(f"cross_entropy needs integer labels and classes; {data.name} holds "
                         f"regression targets (use loss='mse' or a function)")
    if name == "mse" and data.task != "regression":
        raise ValueError(f"mse needs float targets; {data.name} holds class labels (use "
                         f"cross_entropy, or a Dataset with classes=None)")
    if name == "mse":
        return _mse, name
    return (lambda output, labels: _cross_entropy(output, labels, data.classes)), name
