"""``linear`` under an FP8 recipe: quantized operands, one GEMM each way, scales divided back out.

Under a policy with an FP8 recipe (``fpsim.quant.recipe``; e.g. ``get_policy("fp8-delayed")``)
every ``linear`` runs as Transformer Engine's ``Linear`` does under ``autocast(recipe=...)``::

    qx = Q(cast_bf16(x), input)     qw = Q(weight, weight)        # e4m3fn, each its own scale
    y  = round_bf16( fl32( fl32(acc(qx @ qw.T) * fl32(sx_inv * sw_inv)) + bias ) )
    backward, g the output gradient:
    qg = Q(g, grad_output)                                         # e5m2 under "hybrid"
    dx = round( fl32(acc(qg @ qw) * fl32(sg_inv * sw_inv)) )       -> x's gradient format
    dw = round( fl32(acc(qg.T @ qx) * fl32(sg_inv * sx_inv)) )     -> weight's gradient format
    db = sum of g over the batch (not quantized; TE reduces the bf16 gradient)

``Q`` is ``fpsim.quant.tensor_scaling.quantize``: ``round_sat(fl32(v * scale), fmt)``; ``acc``
the recipe's accumulation model into fp32 (default: each dot product exact, rounded once).

Block recipes quantize each operand along the reduction axis of the GEMM it feeds, so the
forward input, the weight and the gradient are quantized once per orientation, as TE's
rowwise and columnwise copies: ``mxfp8`` in 32-element blocks with TE's RCEIL E8M0 scales
(``fpsim.quant.blocks.mx_quantize``; every reduction length a multiple of 32), ``fp8-block``
in 1x128 tiles (inputs, gradients) and 128x128 tiles (weights) with power-of-two float32
scales (``tile_quantize``). Their scales are powers of two, so the dequantized operands are
exact in float32 and the GEMM is ``acc`` of those, with no factor after it.
The weight is quantized from its own (fp32) values, as TE casts the parameter itself; the
input is first cast to the policy's matmul format (bf16), TE's activation dtype. Where
hardware applies the dequantization factor inside the GEMM's epilogue, here it is one fp32
multiply of the fp32 accumulator (exact whenever the scales are powers of two).

Delayed scaling keeps state per GEMM: a ``ScalingSlots`` (TE's ``fp8_meta``), which
``nn.Linear`` owns. Its histories record amaxes only while gradients are recorded (training
forwards and their backward; a ``no_grad`` evaluation reads the scales and changes nothing).
The updates run where TE's run, relative to the casts: the forward tensors' update (TE: at
autocast exit) before this GEMM's first backward cast of the step, the gradient's update (TE:
at the end of backward) before its first forward cast of the next step; so a module used twice
in a step (shared weights, a recurrent cell) collects one amax over both uses, as TE's
``atomicMax`` into ``amax_history[0]`` does.
"""
from __future__ import annotations

from ..backend import scalar, size, xp
from ..formats import FP32
from ..quant.blocks import ScaleRule, dequantize, mx_quantize, tile_quantize
from ..quant.recipe import ScalingKind
from ..quant.tensor_scaling import (DelayedScalingState, amax, fl32, init_delayed, quantize,
                                    record_amax, scale_from_amax, update_delayed)
from ..exact.accumulation import get_accumulation
from .accumulate import acc_matmul, acc_sum
from .context import current_policy, is_grad_enabled
from .numerics import round_array
from .ops_shape import cast, check_linear_shapes
from .tensor import Tensor, as_tensor, record

__all__ = ["ScalingSlots", "quantized_linear", "FORWARD_ROLES", "BACKWARD_ROLES"]

FORWARD_ROLES = ("input", "weight")
BACKWARD_ROLES = ("grad_output",)


class TensorStats:
    """What the training casts of one role did since the last ``take_stats`` (casts under
    ``no_grad`` are not counted): elements cast, how many saturated and how many nonzero
    values became zero, and the last scale used."""

    __slots__ = ("elements", "saturated", "flushed", "scale")

    def __init__(self) -> None:
        self.elements = self.saturated = self.flushed = 0
        self.scale = float("nan")

    def as_dict(self) -> dict:
        n = self.elements
        return {"scale": self.scale, "elements": n,
                "saturated": self.saturated / n if n else 0.0,
                "flushed": self.flushed / n if n else 0.0}


class ScalingSlots:
    """One GEMM's FP8 state (TE's ``fp8_meta``): the delayed-scaling state of each role
    (``input``, ``weight``, ``grad_output``), which updates are pending, and statistics."""

    def __init__(self) -> None:
        self.states: dict = {}
        self.pending: set = set()        # "forward" / "backward": amaxes recorded, not yet used
        self.stats: dict = {role: TensorStats() for role in FORWARD_ROLES + BACKWARD_ROLES}

    def take_stats(self) -> dict:
        """``{role: {scale, elements, saturated, flushed}}`` for the roles cast since the last
        call (fractions of the elements cast), then start counting afresh."""
        taken = {role: s.as_dict() for role, s in self.stats.items() if s.elements}
        self.stats = {role: TensorStats() for role in self.stats}
        return taken

    # --- delayed scaling --------------------------------------------------------------------
    def _state(self, role, recipe):
        if role not in self.states:
            self.states[role] = init_delayed(recipe.history)
        return self.states[role]

    def _update(self, phase, roles, recipe) -> None:
        if phase in self.pending:
            self.pending.discard(phase)
            for role in roles:
                if role in self.states:
                    fmt = recipe.forward if phase == "forward" else recipe.backward
                    self.states[role] = update_delayed(self.states[role], fmt,
                                                       margin=recipe.margin,
                                                       algorithm=recipe.algorithm)

    def begin(self, phase: str, recipe) -> None:
        """Before a cast of ``phase``: run the other phase's pending update (module doc)."""
        if phase == "forward":
            self._update("backward", BACKWARD_ROLES, recipe)
        else:
            self._update("forward", FORWARD_ROLES, recipe)

    def scale_for(self, role, data, fmt, recipe, recording: bool) -> float:
        """The scale to cast ``data`` with; records its amax where the recipe keeps one."""
        if recipe.scaling is ScalingKind.CURRENT:
            return scale_from_amax(amax(data), fmt, power_2=recipe.power_2,
                                   epsilon=recipe.epsilon)
        state = self._state(role, recipe)
        if recording:
            self.states[role] = record_amax(state, amax(data))
            self.pending.add("forward" if role in FORWARD_ROLES else "backward")
        return state.scale

    # --- checkpoints ------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {"states": {role: {"amax_history": list(s.amax_history), "scale": s.scale}
                           for role, s in sorted(self.states.items())},
                "pending": sorted(self.pending)}

    def set_extra_state(self, state) -> None:
        problem = _state_problem(state)
        if problem:
            raise ValueError(f"FP8 scaling state: {problem}; expected {{'states': {{role: "
                             f"{{'amax_history': [floats], 'scale': float}}}}, 'pending': "
                             f"[subset of 'forward', 'backward']}}")
        self.states = {role: DelayedScalingState(tuple(float(v) for v in s["amax_history"]),
                                                 float(s["scale"]))
                       for role, s in state["states"].items()}
        self.pending = set(state["pending"])


def _state_problem(state) -> str | None:
    if not isinstance(state, dict) or set(state) != {"states", "pending"}:
        return f"got {state!r}"
    if not isinstance(state["pending"], list) or \
            not set(state["pending"]) <= {"forward", "backward"}:
        return f"bad 'pending' {state['pending']!r}"
    if not isinstance(state["states"], dict):
        return f"bad 'states' {state['states']!r}"
    for role, s in state["states"].items():
        if role not in FORWARD_ROLES + BACKWARD_ROLES or not isinstance(s, dict) \
                or set(s) != {"amax_history", "scale"} \
                or not isinstance(s["amax_history"], list) or not s["amax_history"] \
                or not all(_is_real(v) for v in s["amax_history"] + [s["scale"]]):
            return f"bad state for role {role!r}: {s!r}"
    return None


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _operand(slots, role, data, recipe, recording, axis):
    """``data`` quantized as the GEMM operand ``role`` reduced along ``axis``: ``(array,
    factor)`` with ``array @ ...`` times ``factor`` the dequantized product. Per-tensor
    recipes give the FP8 values and ``scale_inv``; block recipes give the dequantized values
    (exact: their scales are powers of two) and 1. A training cast (``recording``) counts in
    the stats."""
    fmt = recipe.backward if role in BACKWARD_ROLES else recipe.forward
    if recipe.scaling in (ScalingKind.CURRENT, ScalingKind.DELAYED):
        q = quantize(data, slots.scale_for(role, data, fmt, recipe, recording), fmt)
        array, factor, scale = q.values, q.scale_inv, q.scale
    elif recipe.scaling is ScalingKind.MX:
        q = mx_quantize(data, fmt, axis=axis, scale_rule=ScaleRule.RCEIL)
        array, factor, scale = dequantize(q), 1.0, float("nan")
    else:
        tile = (128, 128) if role == "weight" else (1, 128)
        rows_first = axis in (0, -2) and tile[0] == 1     # 1x128 along the reduction axis
        q = tile_quantize(data.T if rows_first else data, fmt, tile, power_2=recipe.power_2,
                          epsilon=recipe.epsilon)
        array, factor, scale = dequantize(q), 1.0, float("nan")
        array = array.T if rows_first else array
    if recording:
        stats = slots.stats[role]
        stats.elements += size(data)
        stats.saturated += q.saturated
        stats.flushed += q.flushed
        stats.scale = scale
    return array, factor


def _product(a, b, model, out_fmt):
    """``round_out( fl32(acc(a[0] @ b[0]) * fl32(a[1] * b[1])) )`` for two ``_operand``s
    (the dequantization factor one fp32 multiply; inf - inf and 0 * inf are NaN, IEEE)."""
    acc = acc_matmul(a[0], b[0], FP32, model)
    factor = fl32(a[1] * b[1])
    if factor != 1.0:
        with xp.errstate(over="ignore", invalid="ignore", under="ignore"):
            acc = acc * scalar(factor, xp.float32)
    return acc if out_fmt is FP32 else round_array(acc, out_fmt)


def _check_blocks(recipe, **lengths) -> None:
    """MX needs every reduction length to be a multiple of its 32-element blocks."""
    if recipe.scaling is ScalingKind.MX:
        bad = {name: n for name, n in lengths.items() if n % 32}
        if bad:
            raise ValueError(f"{recipe.name}: MX blocks are 32 elements along each GEMM's "
                             f"reduction dimension; {', '.join(f'{k} = {v}' for k, v in bad.items())}"
                             f" is not a multiple of 32 (use sizes divisible by 32, keep the "
                             f"layer out of FP8 with nn.Linear(..., fp8=False), or use a "
                             f"per-tensor recipe: fp8-current, fp8-delayed)")


def quantized_linear(x, weight, bias=None, *, recipe, slots=None, accumulation=None) -> Tensor:
    """``x @ weight.T + bias`` with FP8 operands under ``recipe`` (module doc). ``slots``:
    the GEMM's ``ScalingSlots``; required by delayed scaling, optional otherwise."""
    if recipe.scaling is ScalingKind.DELAYED and slots is None:
        raise ValueError("delayed scaling keeps an amax history per GEMM: call linear from an "
                         "nn.Linear, or pass scaling_slots=ScalingSlots() (one per GEMM, kept "
                         "across steps)")
    slots = slots if slots is not None else ScalingSlots()
    model = get_accumulation(accumulation if accumulation is not None else recipe.accumulation)
    policy = current_policy()
    fmt = policy.matmul
    x = cast(as_tensor(x), fmt)
    weight = as_tensor(weight)
    bias = cast(as_tensor(bias), fmt) if bias is not None else None
    check_linear_shapes(x, weight, bias)
    _check_blocks(recipe, in_features=weight.shape[1], out_features=weight.shape[0])
    recording = is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if recording:
        slots.begin("forward", recipe)
    x2 = xp.reshape(x.data, (-1, x.shape[-1]))
    qx = _operand(slots, "input", x2, recipe, recording, -1)
    qw = _operand(slots, "weight", weight.data, recipe, recording, -1)
    out = _product(qx, (qw[0].T, qw[1]), model, FP32)
    if bias is not None:
        with xp.errstate(over="ignore", invalid="ignore"):
            out = out + bias.data
    out = xp.reshape(round_array(out, fmt), x.shape[:-1] + (weight.shape[0],))
    per_tensor = recipe.scaling in (ScalingKind.CURRENT, ScalingKind.DELAYED)

    def backward(g, g_fmt):
        g2 = xp.reshape(g, (-1, g.shape[-1]))
        _check_blocks(recipe, batch_rows=g2.shape[0])
        slots.begin("backward", recipe)
        qg = _operand(slots, "grad_output", g2, recipe, True, -1)
        dx = dw = db = None
        if x.requires_grad:     # per-tensor operands serve both orientations, blocks do not
            w_cols = qw if per_tensor else _operand(slots, "weight", weight.data, recipe,
                                                   False, 0)
            dx = xp.reshape(_product(qg, w_cols, model, x.grad_fmt), x.shape)
        if weight.requires_grad:
            g_cols = qg if per_tensor else _operand(slots, "grad_output", g2, recipe, False, 0)
            x_cols = qx if per_tensor else _operand(slots, "input", x2, recipe, False, 0)
            dw = _product((g_cols[0].T, g_cols[1]), x_cols, model, weight.grad_fmt)
        if bias is not None and bias.requires_grad:
            db = acc_sum(g2, 0, False, bias.grad_fmt, policy.accumulation)
        return (dx, dw) if bias is None else (dx, dw, db)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return record(out, fmt, parents, backward, "linear")
