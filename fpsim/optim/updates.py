"""What surrounds the pure chain of ``fpsim.optim.transforms``: the user's own transforms,
checked, and the weights written from the chain's result (optax's ``apply_updates``).

A user transform is an object (not a class) with ``init(named) -> state`` and
``update(step, state, params) -> (step, state)``, as the built-in ones
(``fpsim.optim.transforms``). ``Optimizer(params, rule, extra=(t1, t2))`` runs them, in that
order, after the gradients are unscaled and clipped and before the rule: ``step.grads`` is
then one float32 array per parameter, in ``Optimizer.named`` order (the chain never joins
the parameters into one flat array where there are extra transforms), and ``step.grad_norm``
the global norm measured before clipping. A transform returns a new ``StepData``
(``step._replace(grads=...)``) and a new state, and writes into no array it was given;
``check_gradients`` then refuses gradients the rule cannot take. Marking the step skipped
(``step._replace(skipped=True)``) leaves the weights, the rule's state and the step count as
they were.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backend import is_array, round_to, size, xp
from ..formats import Format
from ..options import described
from .transforms import Params, Stateless

__all__ = ["apply_updates", "check_gradients", "CheckGradients", "check_extra"]


def apply_updates(tensors, values, master_fmt: "Format | None", *, flat=None) -> None:
    """Write the new stored values (``StoredValues.values``: one array per tensor) into the
    weights: each rounded to its weight's format, or, where the weight is in the master's
    format and the values hold no NaN, the array itself (rounding into its own format is the
    identity; with a NaN it would quiet a signalling one). Without a master (``master_fmt``
    None) the values are the weights, taken as they are. ``flat``: the one array the values
    are views of, if any (looked at once for a NaN instead of each value).

    >>> from fpsim.autograd import Tensor
    >>> from fpsim.formats import FP32
    >>> w = Tensor(xp.asarray([1.0], xp.float32), "bf16")
    >>> apply_updates([w], [xp.asarray([1.009765625], xp.float32)], FP32)
    >>> w.data.tolist()                       # bf16 keeps 8 bits: rounded to 1 + 2**-7
    [1.0078125]
    """
    values = tuple(values)
    tensors = tuple(tensors)
    if len(values) != len(tensors):
        raise ValueError(f"apply_updates needs one value per tensor, got {len(values)} "
                         f"values for {len(tensors)} tensors")
    nan_free = None if flat is None else size(flat) == 0 or not xp.isnan(xp.min(flat))
    for p, value in zip(tensors, values):
        _write(p, value, master_fmt, nan_free)


def _write(p, new, master_fmt, nan_free: "bool | None") -> None:
    """``new`` (in the update format) into the weights of ``p``; ``nan_free``: whether
    ``new`` is known to hold no NaN (None: look)."""
    if master_fmt is None:
        p.data = new
        return
    if p.fmt == master_fmt:
        if nan_free is None:
            nan_free = size(new) == 0 or not xp.isnan(xp.min(new))
        if nan_free:
            p.data = new       # one array for master and weight (fpsim never writes into
            return             # either in place)
    p.data = round_to(new, p.fmt)


@dataclass(frozen=True)
class CheckGradients(Stateless):
    """Refuses (TypeError) a step whose gradients are not one float32 array of each
    parameter's shape, in order: what the rule needs. It runs after the user's transforms,
    so that a wrong result is named before it goes into an update."""

    def update(self, step, state, params: Params):
        shapes = [tuple(p.shape) for p in params.tensors]
        grads = step.grads
        if (not isinstance(grads, tuple) or len(grads) != len(shapes)
                or not all(is_array(g) and g.dtype == xp.float32
                           and tuple(g.shape) == shape for g, shape in zip(grads, shapes))):
            raise TypeError(f"an extra transform must leave step.grads a tuple of "
                            f"{len(shapes)} float32 arrays of the parameters' shapes "
                            f"{shapes}, got {_described_grads(grads)}")
        return step, state


check_gradients = CheckGradients


def _described_grads(grads) -> str:
    if not isinstance(grads, tuple):
        return type(grads).__name__
    return "(" + ", ".join(_described_array(g) for g in grads) + ")"


def _described_array(array) -> str:
    """``float64[3, 4]``: the dtype's name (without a library's prefix: ``torch.``) and shape."""
    if not is_array(array):
        return type(array).__name__
    return f"{str(array.dtype).rpartition('.')[2]}{list(array.shape)}"


def check_extra(extra) -> tuple:
    """``extra`` as a tuple of transforms: a tuple or list of objects (not classes) with
    callable ``init`` and ``update``; anything else is one TypeError naming it."""
    if not isinstance(extra, (tuple, list)):
        raise TypeError(f"extra must be a tuple of transforms (objects with init(named) and "
                        f"update(step, state, params)), got {described(extra)}")
    for i, transform in enumerate(extra):
        if isinstance(transform, type) or not all(
                callable(getattr(transform, method, None)) for method in ("init", "update")):
            raise TypeError(f"extra[{i}] must be a transform (an object with init(named) "
                            f"and update(step, state, params), such as MyTransform(), not "
                            f"the class), got {described(transform)}")
    return tuple(extra)
