"""``Module``: named parameters, sub-modules and state dicts, the API optimizers build on.

A parameter is a leaf ``Tensor`` with ``requires_grad=True`` assigned as a module attribute;
a sub-module is a ``Module`` attribute. Both are registered in assignment order, which fixes
the order of ``named_parameters()`` and of ``state_dict()`` keys (dotted paths, as PyTorch:
``"0.weight"``, ``"lstm.weight_ih"``).

For optimizers (master weights, loss scaling) the contract is:

- ``parameters()`` / ``named_parameters()``: the parameter tensors themselves (not copies).
  Each has ``fmt`` (its storage format, the policy's ``param`` format when it was created) and
  after ``backward`` a ``.grad`` tensor in ``grad_fmt``. An optimizer updates a parameter by
  assigning ``p.data = <new float32 array already rounded to p.fmt>``.
- ``zero_grad()`` sets every ``.grad`` to ``None``.
- ``state_dict()`` returns ``{name: copy of p.data}`` (host NumPy arrays on every backend)
  for every parameter and buffer, in PyTorch's order; ``load_state_dict(d)`` rounds each array into
  the parameter's (buffer's) format; unknown or missing names, wrong shapes, NaN/inf values,
  values beyond the format's range and values a layer refuses (``check_loaded``: a negative
  running variance) are errors, all checked before anything changes (``check_state_dict``
  checks without loading; ``strict=False`` allows missing and unknown names). A tensor
  shared by two modules is listed once, under its first name; a state dict that lists it
  under each name too (PyTorch's) loads, its values equal under both.

Buffers (``register_buffer``) are tensors that are state but not trained, such as
``BatchNorm2d``'s running statistics: in ``state_dict`` (so checkpoints that save the
state dict carry them), never in ``parameters()``. ``extra_state()``: JSON values outside
the arrays that a resumed run needs (``{}`` here; ``Dropout`` its Philox offset).
``keep_high_precision()`` keeps the GEMMs of a module and its sub-modules out of the
policy's FP8/FP4 recipe. ``training`` (True after construction) says whether the module is
in training mode; ``train(mode)`` / ``eval()`` set it on the module and every sub-module, as
PyTorch's do (``Dropout`` and ``BatchNorm2d`` read it).

FP8/FP4 scaling state is not here: only the layers that run GEMMs hold it. A new layer whose
forward runs a GEMM derives from ``fpsim.nn.gemm.GemmModule`` instead of ``Module`` and passes
``scaling_slots=self.gemm_slots(site)`` to each GEMM op (``ag.linear``, ``ag.matmul``):
its state is then created on first use, saved in its ``extra_state`` by training checkpoints,
listed by ``gemm.named_gemm_slots(model)`` and kept out of the recipe by
``keep_high_precision``.

>>> from fpsim.nn import Linear
>>> layer = Linear(3, 2, rng=0)
>>> [name for name, _ in layer.named_parameters()]
['weight', 'bias']
>>> layer.weight.fmt.name, layer.weight.shape, layer.num_parameters()
('fp32', (2, 3), 8)
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from .. import backend
from ..backend import xp
from ..options import check_flag, check_instance

from ..autograd import Tensor
from ..autograd.numerics import container_of, round_array

__all__ = ["Module", "parameter"]


def parameter(values, fmt=None, *, name: str | None = None) -> Tensor:
    """A trainable leaf tensor: ``values`` (float64, exact draws) rounded once into ``fmt``
    (default: the current policy's ``param`` format)."""
    from ..autograd import current_policy

    fmt = current_policy().param if fmt is None else fmt
    return Tensor(xp.asarray(values, xp.float64), fmt, requires_grad=True, name=name)


class Module:
    """Base class: subclasses set parameters and sub-modules as attributes in ``__init__``
    and define ``forward``; calling the module calls ``forward``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_params" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before setting attributes")
        self._params.pop(name, None)
        self._children.pop(name, None)
        if name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"buffer {name!r} takes a Tensor or None, got "
                                f"{type(value).__name__}")
            self._buffers[name] = value
        elif isinstance(value, Tensor) and value.requires_grad and value.is_leaf:
            self._params[name] = value
        elif isinstance(value, Module):
            self._children[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def register_buffer(self, name: str, tensor) -> None:
        """Hold ``tensor`` (a ``Tensor`` that does not require grad, or None) as the buffer
        ``name``: an attribute listed by ``named_buffers`` and saved by ``state_dict``;
        assigning the attribute later replaces the buffer."""
        if tensor is not None and (not isinstance(tensor, Tensor) or tensor.requires_grad):
            raise TypeError(f"buffer {name!r} must be a Tensor that does not require grad "
                            f"(or None), got {tensor!r}")
        self._buffers[name] = tensor
        object.__setattr__(self, name, tensor)

    def keep_high_precision(self, keep: bool = True) -> "Module":
        """Keep the GEMMs of this module and every sub-module out of the policy's FP8/FP4
        recipe (in its matmul format, bf16), as ``Linear(..., fp8=False)`` keeps one layer;
        ``False`` puts them back. A recipe's ``keep=NAME`` does this for the run
        (``fpsim.train``). Returns self."""
        keep = check_flag("keep", keep)
        for _, module in self.named_modules():
            object.__setattr__(module, "high_precision", keep)
        return self

    def extra_state(self) -> dict:
        """JSON values outside the arrays that a resumed run needs to continue with the same
        bits (``Dropout``: its Philox offset; a GEMM's delayed FP8 scaling history); ``{}`` for
        most modules. Training checkpoints save them (``fpsim.train``), ``set_extra_state``
        puts them back (a layer that runs GEMMs: ``gemm.GemmModule``)."""
        return {}

    def set_extra_state(self, state: dict) -> None:
        if state != {}:
            raise ValueError(f"{type(self).__name__} keeps no extra state, got {state!r}")

    def training_modes(self) -> dict:
        """``{module name: training flag}`` of every sub-module, for ``restore_modes``."""
        return {name: module.training for name, module in self.named_modules()}

    def restore_modes(self, modes: dict) -> None:
        """Put back the flags ``training_modes`` returned."""
        for name, module in self.named_modules():
            object.__setattr__(module, "training", modes[name])

    def train(self, mode: bool = True) -> "Module":
        """Set training mode (``mode``) on this module and every sub-module; returns self."""
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        """``train(False)``."""
        return self.train(False)

    # --- traversal --------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        return iter(self._children.items())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(dotted name, parameter) pairs, own parameters first, then each child's, in
        assignment order; a tensor shared by two modules is listed once."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._params.items():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{module_name}.{name}" if module_name else name), param

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) pairs in the order of ``named_parameters`` (None skipped)."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, buf in module._buffers.items():
                if buf is not None and id(buf) not in seen:
                    seen.add(id(buf))
                    yield (f"{module_name}.{name}" if module_name else name), buf

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return int(sum(p.size for p in self.parameters()))

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # --- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{name: host NumPy copy of t.data}`` on every backend (``Tensor.numpy``): module by
        module, its parameters, then its buffers (PyTorch's order); a shared tensor once."""
        state, seen = {}, set()
        for module_name, module in self.named_modules():
            own = list(module._params.items()) + [(k, b) for k, b in module._buffers.items()
                                                  if b is not None]
            for name, t in own:
                if id(t) not in seen:
                    seen.add(id(t))
                    state[f"{module_name}.{name}" if module_name else name] = t.numpy()
        return state

    def check_loaded(self, name: str, values) -> None:
        """Refuse ``values`` (finite, rounded) for this module's own parameter or buffer
        ``name`` before ``load_state_dict`` changes anything: nothing here; a layer whose
        state has a range (``BatchNorm2d``'s ``running_var`` >= 0) overrides it."""

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load ``state`` (``check_state_dict`` checks all of it first)."""
        loaded = self.check_state_dict(state, strict)
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        for name, values in loaded.items():
            own[name].data = values

    def check_state_dict(self, state: dict, strict: bool = True) -> dict:
        """``{name: the array load_state_dict would assign}`` (rounded into each tensor's
        format); changes nothing. Refuses missing or unknown names (``strict``), wrong shapes,
        NaN/inf values and values beyond the format's range, naming the first."""
        check_instance("state", state, Mapping, "a dict of name -> array, as state_dict gives")
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        state = self._untied(state)
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
        for name, param in own.items():   # check them all before changing any
            if name in state and xp.shape(state[name]) != param.shape:
                raise ValueError(f"load_state_dict: {name!r} has shape "
                                 f"{tuple(xp.shape(state[name]))}, the parameter has shape "
                                 f"{param.shape}")
        owners = {(f"{path}.{name}" if path else name): (module, name)
                  for path, module in self.named_modules()
                  for name in list(module._params) + list(module._buffers)}
        loaded = {}
        for name, param in own.items():
            if name in state:
                loaded[name] = _rounded(name, state[name], param.fmt)
                module, own_name = owners[name]
                try:
                    module.check_loaded(own_name, loaded[name])
                except ValueError as err:
                    raise ValueError(f"load_state_dict: {name!r}: {err}") from None
        return loaded

    def _untied(self, state):
        """``state`` with a shared tensor's later names (PyTorch's state_dict lists a tied
        weight under each of its names; ours once, under the first) folded into the first,
        refused where the two hold different values."""
        first, folded = {}, dict(state)
        for path, module in self.named_modules():
            for name, t in list(module._params.items()) + list(module._buffers.items()):
                full = f"{path}.{name}" if path else name
                if t is None or first.setdefault(id(t), full) == full or full not in state:
                    continue
                tied = first[id(t)]
                if tied in state and not xp.array_equal(xp.asarray(state[tied]),
                                                        xp.asarray(state[full])):
                    raise ValueError(f"load_state_dict: {full!r} is tied to {tied!r} here but "
                                     f"holds other values")
                folded.setdefault(tied, folded.pop(full))
        return folded

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={type(c).__name__}" for n, c in self._children.items())
        return f"{type(self).__name__}({inner})"


def _rounded(name: str, given, fmt):
    """``given`` rounded into ``fmt``'s container; refused where it holds NaN/inf or values
    that round beyond the format's range (a NaN weight would spread through every step)."""
    values = xp.asarray(given)
    if values.dtype not in (xp.float32, xp.float64):
        values = backend.astype(values, xp.float64)
    bad = xp.count_nonzero(xp.logical_not(xp.isfinite(values)))
    if bad:
        raise ValueError(f"load_state_dict: {name!r} holds {int(bad)} NaN/inf value(s); "
                         f"parameters and buffers must be finite")
    rounded = xp.array(round_array(values, fmt), container_of(fmt))
    beyond = xp.count_nonzero(xp.logical_not(xp.isfinite(rounded)))
    if beyond:
        raise ValueError(f"load_state_dict: {name!r} holds {int(beyond)} value(s) beyond the "
                         f"range of {fmt} (largest magnitude {float(xp.max(xp.abs(values)))})")
    return rounded
