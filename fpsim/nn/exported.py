"""``from_torch``'s fallback where torch.fx fails: ``torch.export`` at the ATen level.

torch.fx traces a forward with proxies, so Python that inspects values or code (transformers'
``GPT2LMHeadModel``: "co_varnames is too small") stops it; ``torch.export.export(module,
example, strict=False)`` runs the forward on example inputs and records the ATen ops it
dispatched (``aten.addmm``, ``aten.layer_norm``, ``aten.scaled_dot_product_attention``, ...),
through any Python. What it gives up: sizes the model's Python depends on are fixed to the
example's (the others stay free: ``Dim.AUTO``), the layers are gone (every parameter is a
graph input, named by its state-dict key, so the weights still copy under torch's names),
and Python control flow was resolved for the example. Each ATen node maps onto the engine's
op (``exported_ops``), so it rounds where autocast rounds; each GEMM (``addmm``, ``linear``)
keeps its FP8 scaling state in the module that called it (``transformer.h.0.attn.c_attn``,
every sub-module here a ``GemmModule`` holder), so FP8 recipes, their statistics and ``keep=``
reach it by that name.

Refused in one line before any weight is copied: an ATen op not in ``exported_ops.ATEN``
(named with the module that called it), an export that fails (its first line), and graphs
that write buffers (BatchNorm statistics in training mode: convert such models in eval mode,
or through fx). Dropout with p > 0 in training mode is refused when it runs.
"""
from __future__ import annotations

from .exported_ops import ATEN, GEMMS, DType
from .traced import Lent, Plan, Step, Traced, argument, constant, fill

__all__ = ["Exported", "build", "export_plan"]

_DROPPED = ("device", "layout", "pin_memory", "memory_format", "non_blocking")


def _where(node) -> str:
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    path = stack[-1][0] if stack else ""
    return f"model.{path}" if path else "model"


def _refuse(where, what, supported):
    raise ValueError(f"from_torch: {where}: {what} is not supported on the torch.export "
                     f"route; supported {supported}")


def _plain(value, torch):
    """dtypes by name; devices, layouts and memory formats dropped (one host, one layout)."""
    if isinstance(value, torch.dtype):
        return DType(str(value).removeprefix("torch."))
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return None
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        return type(value)(_plain(v, torch) for v in value)
    return value


def _op_name(target) -> str:
    name = str(target)
    return name if name.startswith("aten.") else \
        f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', name)}"


def _export(module, example, torch):
    """Every size of every example tensor left to export (``Dim.AUTO``): dynamic where the
    model allows it (a batch size, a length), fixed where it does not."""
    sizes = tuple({i: torch.export.Dim.AUTO for i in range(t.ndim)}
                  if isinstance(t, torch.Tensor) else None for t in example)
    try:
        return torch.export.export(module, tuple(example), dynamic_shapes=sizes, strict=False)
    except Exception as err:    # export raises whatever the forward raises on fake tensors
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"from_torch: model ({type(module).__name__}) cannot be exported "
                         f"by torch.export either ({type(err).__name__}: {first})") from None


def _input_step(node, spec, program, constants):
    kind = spec.kind.name
    if kind == "USER_INPUT":
        return Step(node.name, "placeholder", node.name, (), {}, "model")
    if kind in ("PARAMETER", "BUFFER"):
        return Step(node.name, "get_attr", spec.target, (), {}, "model")
    if kind == "CONSTANT_TENSOR":
        constants[f"constant:{spec.target}"] = constant(program.constants[spec.target])
        return Step(node.name, "get_attr", f"constant:{spec.target}", (), {}, "model")
    _refuse("model", f"the graph input {node.name} ({kind})", "inputs: tensors, parameters, "
                                                              "buffers and constants")


def _call_step(node, torch):
    name, where = _op_name(node.target), _where(node)
    if name not in ATEN:
        _refuse(where, name, f"ATen ops: {', '.join(sorted(ATEN))}")
    args = argument(_plain(node.args, torch), node, torch)
    kwargs = {k: _plain(v, torch) for k, v in node.kwargs.items() if k not in _DROPPED}
    return Step(node.name, "call_function", name, args, argument(kwargs, node, torch), where)


def export_plan(module, example):
    """(plan, constants, GEMM sites) of the module exported on ``example``."""
    import torch
    import torch.export

    program = _export(module, example, torch)
    signature = program.graph_signature
    written = [s for s in signature.output_specs if s.kind.name != "USER_OUTPUT"]
    if written:
        _refuse("model", f"writing {written[0].target} during the forward",
                "graphs: ones that write no buffer (convert BatchNorm models in eval mode)")
    specs = {spec.arg.name: spec for spec in signature.input_specs}
    steps, constants, sites = [], {}, {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            steps.append(_input_step(node, specs[node.name], program, constants))
        elif node.op == "call_function":
            steps.append(_call_step(node, torch))
            if steps[-1].target in GEMMS:     # the calling module's GEMM ("" if its first)
                path = steps[-1].where.removeprefix("model").lstrip(".")
                taken = any(owner == path for owner, _ in sites.values())
                sites[node.name] = (path, node.name if taken or not path else "")
        elif node.op == "output":
            outputs = argument(node.args[0], node, torch)
            single = program.call_spec.out_spec is None or program.call_spec.out_spec.is_leaf()
            steps.append(Step(node.name, "output", "output",
                              (outputs[0] if single else tuple(outputs),), {}, "model"))
        else:
            _refuse(_where(node), f"the node {node.name} ({node.op})", "nodes: ATen calls")
    return Plan(tuple(steps), {}, ()), constants, sites


class Exported(Traced):
    """A model converted through torch.export (module doc): ``forward`` takes inputs like the
    example's and runs each ATen node through the engine."""

    def __init__(self, plan: Plan, constants, sites):
        super().__init__(plan, constants)
        object.__setattr__(self, "_fpsim_sites", dict(sites))

    def _run(self, step, args, kwargs):
        if step.kind != "call_function":
            return super()._run(step, args, kwargs)
        if step.target in GEMMS:
            path, site = self._fpsim_sites[step.name]
            owner = self._path(path) if path else self
            kwargs = {**kwargs, "scaling_slots": owner.gemm_slots(site)}
        return ATEN[step.target](*args, **kwargs)

    def __repr__(self) -> str:
        return f"Exported({len(self._fpsim_plan.steps)} ATen steps)"


def _holders(layer) -> str:
    return "gemm holder"


def build(module, example, lent: Lent) -> Exported:
    """The ``Exported`` fpsim model of ``module`` (module doc): every sub-module a holder of
    its parameters and buffers under torch's names (the graph calls no layer)."""
    plan, constants, sites = export_plan(module, example)
    return fill(Exported(plan, constants, sites), module, lent._replace(kind=_holders))
