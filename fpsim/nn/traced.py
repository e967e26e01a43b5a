"""Any ``torch.nn.Module`` as an fpsim model, by tracing its ``forward`` (``from_torch``'s
route for a module that is neither a known layer nor a ``Sequential``).

The route is torch.fx's symbolic tracer, part of PyTorch (no new dependency; buffers read as
graph attributes, so a forward may slice a mask buffer by its input's sizes), for what its
graph keeps: torch's own layers stay ``call_module`` nodes under their names in the model
(``layer1.0.conv1``), so each becomes the engine's own layer (``Conv2d``, ``Linear``,
``MultiheadAttention``, ...) with its FP8 scaling slots, its ``keep=`` name and its place in
the state dict; the model's own code is left as functions (``torch.flatten``, ``F.gelu``,
``operator.add``) and tensor methods (``.view``, ``.transpose``, ``.softmax``), each mapped
onto the engine's op (``traced_ops``), so each rounds where autocast rounds. ``torch.export``
works at the ATen level instead (``aten.addmm``, ``aten.layer_norm``): it gets through
data-dependent control flow, but loses the layers (each parameter becomes a graph input and
each GEMM an anonymous ATen call), so FP8 recipes, ``keep=`` and per-layer statistics would
have no layer to attach to; fx refuses such models (transformers' ``GPT2LMHeadModel``:
"co_varnames is too small") and ``from_torch`` says so in one line.

``trace(module)`` returns the ``Plan``: its steps (one per graph node, arguments as ``Ref``s
to earlier steps), the paths of the layers it calls and of the attributes it reads. Every
node is checked here, before any weight is copied: a function or method not in
``traced_ops``, an argument that is not a number, string, slice or nested tuple of them
(a ``torch.dtype``, a device) or ``*args`` is refused in one line naming the node, the module
whose ``forward`` made the call and what is supported. ``Traced(plan)`` is the fpsim module
that runs the plan; ``build(module, lent)`` traces the module, checks every layer in it (a
torch layer fpsim lacks is refused by its path, still before any weight is copied) and fills
a ``Traced`` with the converted layers (``from_torch``'s table, lent as ``Lent``), and with
holders for the model's own sub-modules, under the torch model's names: its state dict keys
are torch's, and sharing (a module used twice, tied weights) carries over as in
``from_torch``.

>>> import torch
>>> class Net(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = torch.nn.Linear(4, 2)
...     def forward(self, x):
...         return torch.nn.functional.relu(self.fc(x)) + x[:, :2]
>>> [(step.kind, step.target) for step in trace(Net()).steps]    # doctest: +NORMALIZE_WHITESPACE
[('placeholder', 'x'), ('call_module', 'fc'), ('call_function', 'torch.nn.functional.relu'),
 ('call_function', '_operator.getitem'), ('call_function', '_operator.add'),
 ('output', 'output')]
"""
from __future__ import annotations

import builtins
from typing import NamedTuple

from .. import autograd as ag
from ..backend import xp
from .gemm import GemmModule
from .layers import ModuleList, Sequential
from .module import Module
from .traced_ops import ATTRIBUTES, FUNCTIONS, GEMMS, METHODS

__all__ = ["Lent", "Plan", "Ref", "Step", "Traced", "Untraceable", "argument", "build",
           "constant", "fill", "trace"]


class Ref(NamedTuple):
    """An argument that is the value of an earlier step."""
    name: str


class Step(NamedTuple):
    name: str           # the fx node's name, unique in the graph
    kind: str           # placeholder, call_module, get_attr, call_function, call_method, output
    target: str         # module or attribute path, function's dotted name, method name
    args: tuple
    kwargs: dict
    where: str          # "model" or "model.<path of the module whose forward made the call>"


class Plan(NamedTuple):
    steps: tuple
    layers: dict        # path of each module called -> where it was first called
    attributes: tuple   # paths of the parameters, buffers and tensors the graph reads


def _torch_name(target, torch) -> str:
    """The dotted name users write (``torch.nn.functional.gelu``, not ``torch._C._nn``)."""
    name = getattr(target, "__name__", repr(target))
    for prefix, home in (("torch.nn.functional", torch.nn.functional), ("torch", torch)):
        if getattr(home, name, None) is target:
            return f"{prefix}.{name}"
    return f"{getattr(target, '__module__', None) or type(target).__module__}.{name}"


def _where(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack), "") if stack else ""
    return f"model.{path}" if path else "model"


def _refuse(where, what, supported):
    raise ValueError(f"from_torch: {where}: {what} is not supported; supported "
                     f"{supported}")


def argument(value, node, torch):
    """A node argument as plain data: nodes become ``Ref``s; numbers, strings, None,
    slices and containers of them stay; anything else (dtype, device, tensor) is refused."""
    if isinstance(value, torch.fx.Node):
        return Ref(value.name)
    if isinstance(value, (tuple, list)):
        return type(value)(argument(v, node, torch) for v in value) \
            if not isinstance(value, torch.Size) else tuple(value)
    if isinstance(value, dict):
        return {k: argument(v, node, torch) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(argument(v, node, torch) for v in (value.start, value.stop,
                                                            value.step)))
    if value is None or value is Ellipsis or isinstance(value, (bool, int, float, str)):
        return value
    _refuse(_where(node), f"{node.name}'s argument {type(value).__module__}."
                          f"{type(value).__name__} ({value!r})",
            "arguments: numbers, strings, None, slices and tuples of them")


def _target(node, torch) -> str:
    if node.op == "call_function":
        name = _torch_name(node.target, torch)
        if name not in FUNCTIONS and name != "builtins.getattr":
            _refuse(_where(node), name, f"functions: {', '.join(sorted(FUNCTIONS))}")
        if name == "builtins.getattr" and node.args[1] not in ATTRIBUTES:
            _refuse(_where(node), f"the tensor attribute {node.args[1]!r}",
                    f"attributes: {', '.join(ATTRIBUTES)}")
        return name
    if node.op == "call_method" and node.target not in METHODS:
        _refuse(_where(node), f"the tensor method .{node.target}()",
                f"methods: {', '.join(sorted(METHODS))}")
    if node.op == "placeholder" and node.target.startswith("*"):
        _refuse("model", f"forward's {node.target}", "inputs: named arguments")
    return str(node.target)


class Untraceable(ValueError):
    """torch.fx cannot trace the model (``from_torch`` may then export it)."""


def trace(module) -> Plan:
    """The module's forward as a ``Plan`` (module doc); a ValueError in one line for what
    fx cannot trace or fpsim cannot run."""
    import torch
    import torch.fx

    try:
        tracer = torch.fx.Tracer()
        tracer.proxy_buffer_attributes = True   # buffers as graph inputs: sliced by sizes
        graph = tracer.trace(module)
    except Exception as err:    # fx raises whatever the forward's Python raises on proxies
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise Untraceable(f"from_torch: model ({type(module).__name__}) cannot be traced by "
                          f"torch.fx ({type(err).__name__}: {first}); give example=(inputs,) "
                          f"to convert it through torch.export") from None
    steps, attributes = [], []
    layers: dict = {}
    for node in graph.nodes:
        target = _target(node, torch)
        if node.op == "call_module":
            layers.setdefault(target, _where(node))
        elif node.op == "get_attr":
            attributes.append(target)
        steps.append(Step(node.name, node.op, target, argument(node.args, node, torch),
                          argument(node.kwargs, node, torch), _where(node)))
    return Plan(tuple(steps), layers, tuple(attributes))


def _resolve(value, env):
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, (tuple, list)):
        return type(value)(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(_resolve(value.start, env), _resolve(value.stop, env),
                     _resolve(value.step, env))
    return value


# fpsim's TransformerBlock names its masks as MultiheadAttention does
_KEYWORDS = {"src_mask": "attn_mask", "src_key_padding_mask": "key_padding_mask"}


class Traced(GemmModule):
    """A traced torch model (module doc): ``forward`` takes the torch forward's arguments
    (fpsim Tensors, arrays, integer token ids) and runs each step through the engine."""

    _fpsim_plan: Plan           # set past Module.__setattr__: not a parameter or submodule

    def __init__(self, plan: Plan, constants=None):
        super().__init__()
        object.__setattr__(self, "_fpsim_plan", plan)
        object.__setattr__(self, "_fpsim_constants", dict(constants or {}))

    def forward(self, *args, **kwargs):
        env = {}
        inputs = [s for s in self._fpsim_plan.steps if s.kind == "placeholder"]
        if len(args) > len(inputs) or set(kwargs) - {s.target for s in inputs}:
            raise TypeError(f"the traced model takes ({', '.join(s.target for s in inputs)}), "
                            f"got {len(args)} positional and {sorted(kwargs)} by name")
        for step in self._fpsim_plan.steps:
            if step.kind == "placeholder":
                env[step.name] = self._input(step, inputs.index(step), args, kwargs)
            elif step.kind == "output":
                return _resolve(step.args[0], env)
            else:
                env[step.name] = self._run(step, _resolve(step.args, env),
                                           _resolve(step.kwargs, env))
        raise ValueError("the traced graph has no output")

    @staticmethod
    def _input(step, position, args, kwargs):
        if position < len(args):
            return args[position]
        if step.target in kwargs:
            return kwargs[step.target]
        if step.args:
            return step.args[0]     # the forward's default
        raise TypeError(f"the traced model's forward is missing its argument {step.target!r}")

    def _run(self, step, args, kwargs):
        if step.kind == "call_module":
            layer = self._path(step.target)
            return layer(*args, **{_KEYWORDS.get(k, k): v for k, v in kwargs.items()
                                   if k != "is_causal"})
        if step.kind == "get_attr":
            constant = self._fpsim_constants.get(step.target)
            return self._path(step.target) if constant is None else constant
        if step.kind == "call_method":
            return METHODS[step.target](*args, **kwargs)
        if step.target == "builtins.getattr":
            return builtins.getattr(*args)
        if step.target in GEMMS:
            kwargs = {**kwargs, "scaling_slots": self.gemm_slots(step.name)}
        return FUNCTIONS[step.target](*args, **kwargs)

    def _path(self, dotted):
        value = self
        for part in dotted.split("."):
            value = getattr(value, part)
        return value

    def __repr__(self) -> str:
        layers = ", ".join(self._fpsim_plan.layers)
        return f"Traced({len(self._fpsim_plan.steps)} steps; layers: {layers})"


def constant(tensor):
    """A tensor the graph reads that is not state (a non-persistent buffer, a plain
    attribute): integer and boolean ones as arrays (indices, masks), float ones as fp32
    Tensors (a buffer keeps its dtype under autocast)."""
    array = tensor.detach().cpu().numpy()
    if array.dtype.kind in "biu":
        return xp.asarray(array)
    return ag.Tensor(array, "fp32")


class Lent(NamedTuple):
    """What ``from_torch`` lends the walk: ``kind(layer)`` ("layer", "Sequential",
    "ModuleList", "holder", "gemm holder" or "refused"), ``convert(layer, path)`` (a layer
    by its table), ``own_state(ours, layer, path)`` (a holder's own parameters, buffers and
    mode) and the ``supported`` layers' names."""
    kind: object
    convert: object
    own_state: object
    supported: str


def _join(path, name):
    return ".".join(part for part in (path, name) if part)


def _check_layers(layer, path, plan, lent):
    """Every torch layer in the model is one fpsim converts, and every module the graph
    calls is a layer (refused by its path in the model)."""
    for name, child in layer._modules.items():
        if child is None:
            continue
        where, kind = _join(path, name), lent.kind(child)
        if kind == "refused" or (where in plan.layers and kind != "layer"):
            _refuse(f"model.{where}", f"{type(child).__module__}.{type(child).__name__}",
                    f"layers: {lent.supported}")
        if kind != "layer":
            _check_layers(child, where, plan, lent)


def _constants(module, plan):
    """The tensors the graph reads that are not state (non-persistent buffers, plain
    attributes), as ``constant`` values."""
    state = module.state_dict(keep_vars=True)
    held = {}
    for path in plan.attributes:
        if path in state:
            continue
        owner, _, attr = path.rpartition(".")
        value = getattr(module.get_submodule(owner), attr)
        if not hasattr(value, "detach"):
            _refuse(f"model.{path}", f"reading a {type(value).__name__}",
                    "attributes: tensors")
        held[path] = constant(value)
    return held


_HOLDER_CLASSES = {"Sequential": Sequential, "ModuleList": ModuleList, "holder": Module,
                   "gemm holder": GemmModule}     # holds the GEMMs an export graph runs in it


class _Walk:
    """Sub-modules converted so far (a module used twice is one fpsim module)."""

    def __init__(self, lent, root, ours):
        self.lent, self.done = lent, {id(root): ours}

    def part(self, layer, path):
        kind = self.lent.kind(layer)
        if kind == "layer":
            return self.lent.convert(layer, path)
        ours = self.done.get(id(layer))
        if ours is None:
            ours = self.done[id(layer)] = _HOLDER_CLASSES[kind]()
            self.fill(ours, layer, path)
        return ours

    def fill(self, ours, layer, path):
        """Give ``ours`` the layer's own state, mode and children, under the layer's names."""
        self.lent.own_state(ours, layer, path)
        for name, child in layer._modules.items():
            if child is None:
                continue
            if hasattr(ours, name):
                _refuse(f"model.{path}" if path else "model", f"the child name {name!r} "
                        f"(taken by fpsim's {type(ours).__name__})", "names: any other")
            setattr(ours, name, self.part(child, _join(path, name)))


def fill(ours, module, lent: Lent):
    """Give the fpsim model ``ours`` the torch ``module``'s parts under its names."""
    _Walk(lent, module, ours).fill(ours, module, "")
    return ours


def build(module, lent: Lent) -> Traced:
    """The ``Traced`` fpsim model of ``module`` (module doc)."""
    plan = trace(module)                    # refuses unsupported nodes: nothing copied yet
    _check_layers(module, "", plan, lent)
    return fill(Traced(plan, _constants(module, plan)), module, lent)
