"""The mixed-precision optimizer step: master weights, loss-scale handling, clipping, and an
account of every update that was lost.

One ``step(scaler_state)``, in order (each rounding named)::

    grads  = [p.grad for p in params]            # in their formats (fp16 under "16-true")
    found  = scaler's overflow test on the scaled grads      (fpsim.scaling.check_overflow)
    state  = scaler_state.update(found)          # skip? grow? back off?
    grads  = float32(grads) * inv_scale          # exact widening; one fp32 rounding
    if state skipped: stop here, weights untouched
    norm   = fp32(sqrt(exact sum of squares))    # global L2 norm, correctly rounded
    if clip_norm and norm > clip_norm: grads *= fp32(clip_norm / (norm + 1e-6))   (torch)
    master = rule(master, grads) in the master format (fp32 by default)
    param  = round(master, param format)         # the working copy the model computes with

Without a master copy (``master=None``) the rule computes in each parameter's own format and
writes there directly: an update smaller than half an ulp of its weight is lost (for fp16,
weight/update ratios above 2048). ``StepReport`` counts lost updates every step.

Many small parameters are updated as one flat array (``_together``: elementwise rules only);
the bits are those of one parameter at a time, but for the sign of a NaN computed from two
NaNs of opposite signs (NumPy's SIMD loops return one operand in their vector body and the
other in their tail, so that sign depends on an element's position, and on the machine).

>>> import numpy as np
>>> from fpsim.autograd import Tensor
>>> from fpsim.optim import SGD
>>> w = Tensor(np.float32([1.0, 1.0]), "fp16", requires_grad=True)
>>> w.grad = Tensor(np.float32([2.0 ** -9, 2.0 ** -14]), "fp16")
>>> report = Optimizer([w], SGD(lr=0.5), master=None).step()
>>> w.data.tolist(), report.lost_updates
([0.9990234375, 1.0], 1)
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable, NamedTuple

from ..backend import xp

from ..autograd import Tensor
from ..exact import global_norm
from ..formats import FP32, Format, get
from ..backend import round_to
from ..scaling import check_overflow, found_inf, unscale
from .arith import Arith
from .rules import SGD, Adam, Update, check_number

__all__ = ["Optimizer", "StepReport"]


class StepReport(NamedTuple):
    """What one optimizer step did. ``lost_updates`` counts elements whose intended increment
    was nonzero but whose stored value (the master copy, or the weights without one) did not
    change; ``updates`` counts elements with a nonzero intended increment."""

    step: int
    found_inf: bool
    skipped: bool
    scale: float
    grad_norm: float
    clipped: bool
    updates: int
    lost_updates: int
    scaler_state: object

    @property
    def lost_fraction(self) -> float:
        return self.lost_updates / self.updates if self.updates else 0.0


class Optimizer:
    """Applies an update rule (``SGD``, ``Adam``) to parameters, keeping a master copy.

    ``params``: a ``Module`` (its named parameters) or an iterable of ``Tensor`` or
    ``(name, Tensor)``. ``master``: the master copy's format (default fp32), or None to
    update the weights in their own format (where the weights are in the master's format,
    after a step ``p.data`` is the master array itself, not a copy). ``clip_norm``: clip the
    global gradient norm after unscaling, as ``torch.nn.utils.clip_grad_norm_`` does.
    """

    def __init__(self, params, rule, *, master: "Format | str | None" = FP32,
                 clip_norm: float | None = None):
        self.named = _named(params)
        if not self.named:
            raise ValueError("the optimizer got no parameters")
        if clip_norm is not None:
            check_number("clip_norm", clip_norm, 0.0, low_open=True)
        self.rule = rule
        self.clip_norm = clip_norm
        self.master_fmt = None if master is None else get(master)
        self.masters: dict[str, xp.ndarray] = {}
        for name, p in self.named:
            if not isinstance(p.fmt, Format):
                raise ValueError(f"parameter {name!r} is in {p.fmt}, not a number format; the "
                                 f"optimizer simulates formats (use a policy like '32-true')")
            if self.master_fmt is not None:
                widened = round_to(xp.asarray(p.data, xp.float32), self.master_fmt)
                if not xp.array_equal(widened, p.data, equal_nan=True):
                    raise ValueError(f"parameter {name!r} ({p.fmt}) does not fit the master "
                                     f"format {self.master_fmt}; pick a wider master")
                self.masters[name] = widened.copy()
        self.states = {name: rule.init(p.data) for name, p in self.named}
        self.step_count = 0
        self._flats: dict = {}    # _update_together's flat results and the views of them

    # --- the step ---------------------------------------------------------------------------
    def step(self, scaler_state=None) -> StepReport:
        grads = [_grad_array(p) for _, p in self.named]
        together = self._together()
        if together is not None:        # elementwise from here on: one flat gradient
            flat = [_joined(grads)]
            if _elementwise_check(scaler_state):    # "any inf or NaN": one pass over all
                grads = flat
        if scaler_state is not None:
            found = check_overflow(grads, scaler_state)
            new_state = scaler_state.update(found)
            skipped, scale = new_state.skipped, scaler_state.scale
        else:
            found, new_state, skipped, scale = found_inf(grads), None, False, 1.0
        if skipped:
            return StepReport(self.step_count, found, True, scale, float("nan"), False, 0, 0,
                              new_state)
        if together is not None:
            grads = flat
        if scaler_state is not None:
            grads = unscale(grads, scaler_state, copy=False)   # read only, never written
        norm = global_norm(grads)
        clipped = False
        if self.clip_norm is not None:
            # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6), clamped to 1,
            # all in fp32; a coefficient of 1 leaves the gradients as they are.
            coef = xp.float32(self.clip_norm) / (norm + xp.float32(1e-6))
            if coef < 1:
                grads = [xp.asarray(g, xp.float32) * coef for g in grads]
                clipped = True
        self.step_count += 1
        if together is not None:
            updates, lost = self._update_together(together, grads[0])
        else:
            updates = lost = 0
            for (name, p), grad in zip(self.named, grads):
                stored = self.masters[name] if self.master_fmt is not None else p.data
                ops = _arith(self.master_fmt if self.master_fmt is not None else p.fmt)
                result: Update = self.rule.apply(ops, stored, grad, self.states[name],
                                                 self.step_count)
                new = xp.asarray(result.param, xp.float32).reshape(p.shape)
                counts = _counts(result, new, stored)
                updates, lost = updates + counts[0], lost + counts[1]
                self.states[name] = result.state
                self._store(name, p, new, None)
        return StepReport(self.step_count, found, False, scale, float(norm), clipped, updates,
                          lost, new_state)

    def _together(self):
        """(format, stored arrays) where the step updates every parameter as one flat array:
        the rule is elementwise (SGD, Adam: the same bits as one parameter at a time, save
        a NaN-from-two-NaNs' sign: module docstring) and the parameters are many small ones
        (one pass instead of a pass per parameter, whose fixed cost dominated); None where
        the step goes parameter by parameter."""
        named = self.named
        if (type(self.rule) not in _ELEMENTWISE_RULES or len(named) < 2
                or sum(p.size for _, p in named) > (len(named) - 1) * _TOGETHER_MAX):
            return None
        if self.master_fmt is not None:
            fmt, stored = self.master_fmt, [self.masters[name] for name, _ in named]
        else:
            fmt, stored = named[0][1].fmt, [p.data for _, p in named]
            if any(p.fmt != fmt for _, p in named):
                return None
        fields = zip(*(self.states[name] for name, _ in named))
        if any(not (all(f is None for f in field) or all(_flat32(f) for f in field))
               for field in fields) or not all(_flat32(v) for v in stored):
            return None
        return fmt, stored

    def _update_together(self, together, grad) -> tuple[int, int]:
        """The rule on every parameter at once (``grad``: the flat gradient); (updates, lost
        updates)."""
        fmt, stored = together
        named = self.named
        states = [self.states[name] for name, _ in named]
        fields = list(zip(*states))
        flat_stored = self._rejoined("stored", stored)
        state = type(states[0])(*(None if field[0] is None else self._rejoined(i, field)
                                  for i, field in enumerate(fields)))
        result: Update = self.rule.apply(_arith(fmt), flat_stored, grad, state, self.step_count)
        new = xp.asarray(result.param, xp.float32).reshape(-1)
        counts = _counts(result, new, flat_stored)
        nan_free = new.size == 0 or not xp.isnan(new.min())
        flats = [None if value is None else value.reshape(-1) for value in result.state]
        views = {key: [] for key in ["stored", *range(len(flats))]}
        start = 0
        for name, p in named:
            part = slice(start, start + p.size)
            start += p.size
            fields_new = [None if flat is None else flat[part].reshape(p.shape)
                          for flat in flats]
            self.states[name] = type(result.state)(*fields_new)
            for i, view in enumerate(fields_new):
                views[i].append(view)
            views["stored"].append(new[part].reshape(p.shape))
            self._store(name, p, views["stored"][-1], nan_free)
        self._flats = {key: (tuple(views[key]), flat)
                       for key, flat in [("stored", new), *enumerate(flats)] if flat is not None}
        return counts

    def _rejoined(self, key, arrays) -> xp.ndarray:
        """``arrays`` joined flat: the last step's flat result itself where ``arrays`` are
        still the views of it that step handed out (no copy), else a new join."""
        views, flat = self._flats.get(key, ((), None))
        if len(views) == len(arrays) and all(a is b for a, b in zip(arrays, views)):
            return flat
        return _joined(arrays)

    def _store(self, name: str, p: Tensor, new, nan_free: bool | None) -> None:
        """The step's result ``new`` (in the update format) as the master and the weights;
        ``nan_free``: whether ``new`` is known to hold no NaN (None: look)."""
        if self.master_fmt is None:
            p.data = new
            return
        self.masters[name] = new
        if nan_free is None:
            nan_free = new.size == 0 or not xp.isnan(new.min())
        if p.fmt == self.master_fmt and nan_free:
            p.data = new           # rounding into its own format: the identity; one array
            # for both (fpsim never writes into either in place)
        else:                      # (NaNs: round_to's rule quiets a signalling one)
            p.data = round_to(new, p.fmt)

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, xp.ndarray]:
        """Every array the optimizer owns (master copies, rule state) plus the step count."""
        out = {"step_count": xp.int64(self.step_count)}
        for name, master in self.masters.items():
            out[f"master/{name}"] = master
        for name, state in self.states.items():
            for field, value in state._asdict().items():
                if value is not None:
                    out[f"state/{name}/{field}"] = value
        return out

    def load_state_dict(self, arrays: dict[str, xp.ndarray]) -> None:
        """Load what ``state_dict`` gave. Every array is checked (names, shapes, float dtypes,
        a non-negative integer step count) before anything changes; ``ValueError`` names the
        first that does not fit."""
        expected = self._expected_state()
        unknown = sorted(set(arrays) - set(expected))
        if unknown:
            raise ValueError(f"optimizer state has arrays this optimizer does not have: "
                             f"{unknown[:5]}")
        required = [k for k, (shape, _) in expected.items()
                    if k not in arrays and (k == "step_count" or k.startswith("master/"))]
        if required:
            raise ValueError(f"optimizer state lacks {required[:5]}")
        for key, value in arrays.items():
            shape, kinds = expected[key]
            value = xp.asarray(value)
            if value.shape != shape or value.dtype.kind not in kinds:
                raise ValueError(f"optimizer state {key!r} is {value.dtype}{list(value.shape)}; "
                                 f"expected shape {list(shape)} of kind {kinds!r}")
        step_count = int(arrays["step_count"])
        if step_count < 0:
            raise ValueError(f"optimizer step_count must be >= 0, got {step_count}")
        self.step_count = step_count
        for name, p in self.named:
            if self.master_fmt is not None:
                self.masters[name] = xp.array(arrays[f"master/{name}"], xp.float32)
            template = self.rule.init(p.data)
            fields = {f: (xp.array(arrays[f"state/{name}/{f}"])
                          if f"state/{name}/{f}" in arrays else None)
                      for f in template._fields}
            self.states[name] = type(template)(**fields)

    def _expected_state(self) -> dict:
        """Array name -> (shape, accepted dtype kinds) of everything ``state_dict`` may give."""
        expected = {"step_count": ((), "iu")}
        for name, p in self.named:
            if not isinstance(p.fmt, Format):
                raise ValueError(f"parameter {name!r} is in {p.fmt}, not a number format; the "
                                 f"optimizer simulates formats (use a policy like '32-true')")
            if self.master_fmt is not None:
                expected[f"master/{name}"] = (tuple(p.shape), "f")
            for field in self.rule.init(p.data)._fields:
                expected[f"state/{name}/{field}"] = (tuple(p.shape), "f")
        return expected


#: the one-pass update (``Optimizer._together``) runs where the parameters hold at most this
#: many elements per pass it saves (parameters - 1): joining costs about 1 ns an element,
#: a pass per parameter some 40 us of fixed cost (0 turns the one-pass update off)
_TOGETHER_MAX = 1 << 15
_ELEMENTWISE_RULES = (SGD, Adam)


def _counts(result: Update, new, stored) -> tuple[int, int]:
    """(elements the rule meant to move, those of them whose stored value did not change)."""
    if result.counts is not None:       # counted by the rule, against the same stored values
        return result.counts
    moved = result.moved().reshape(-1)
    kept = xp.equal(new.reshape(-1), xp.asarray(stored).reshape(-1))
    return (int(xp.count_nonzero(moved)),
            int(xp.count_nonzero(xp.logical_and(moved, kept, out=kept))))


def _elementwise_check(scaler_state) -> bool:
    """Whether the step's overflow test looks at each element alone (any inf or NaN, on the
    gradients or on their unscaled copies), so that it gives the same answer on the joined
    flat gradient; the "sum" test sums each gradient on its own."""
    return scaler_state is None or scaler_state.scaler.overflow_check == "nonfinite"


def _flat32(value) -> bool:
    return isinstance(value, xp.ndarray) and value.dtype == xp.float32


def _joined(arrays) -> xp.ndarray:
    return xp.concatenate([a.reshape(-1) for a in arrays])


@lru_cache(maxsize=None)
def _arith(fmt: Format) -> Arith:
    """One ``Arith`` per format (it holds only constants of the format)."""
    return Arith(fmt)


def _grad_array(p: Tensor) -> xp.ndarray:
    if p.grad is None:
        return xp.zeros(p.shape, xp.float32)
    grad = p.grad.data if isinstance(p.grad, Tensor) else xp.asarray(p.grad)
    return xp.asarray(grad, xp.float32)


def _named(params) -> list[tuple[str, Tensor]]:
    if hasattr(params, "named_parameters"):
        return list(params.named_parameters())
    named = []
    for i, item in enumerate(params if isinstance(params, Iterable) else [params]):
        name, tensor = item if isinstance(item, tuple) else (str(i), item)
        if not isinstance(tensor, Tensor):
            raise TypeError(f"parameter {name!r} is a {type(tensor).__name__}, not a Tensor")
        named.append((name, tensor))
    return named
