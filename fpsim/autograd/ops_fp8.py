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
``nvfp4`` quantizes as TE's ``NVFP4BlockScaling`` does (``ops_fp4``): 1x16 blocks of FP4 with
E4M3 scales and a per-tensor scale, 16x16 weight tiles, stochastically rounded gradients and
the random Hadamard transform on the weight-gradient GEMM's operands; its GEMMs multiply the
block-decoded operands and apply the per-tensor scales in one fp32 factor after ``acc``.
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
from ..options import check_count_between
from ..quant.tensor_scaling import (DelayedScalingState, amax, fl32, init_delayed, quantize,
                                    record_amax, scale_from_amax, update_delayed)
from ..exact.accumulation import get_accumulation
from .accumulate import acc_matmul, acc_sum
from .context import current_policy, is_grad_enabled
from .numerics import round_array
from .ops_fp4 import WGRAD_ROLES, global_scale, nvfp4_alpha, nvfp4_operand
from .ops_shape import cast, check_linear_shapes
from .tensor import Tensor, as_tensor, record

__all__ = ["ScalingSlots", "quantized_linear", "FORWARD_ROLES", "BACKWARD_ROLES",
           "WGRAD_ROLES", "roles_of"]

FORWARD_ROLES = ("input", "weight")
BACKWARD_ROLES = ("grad_output",)


def roles_of(recipe) -> tuple:
    """The tensors a GEMM under ``recipe`` quantizes and counts: input, weight, grad_output,
    and under NVFP4 the weight-gradient GEMM's own casts (``WGRAD_ROLES``)."""
    extra = WGRAD_ROLES if recipe is not None and recipe.scaling is ScalingKind.NVFP4 else ()
    return FORWARD_ROLES + BACKWARD_ROLES + extra


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
    (``input``, ``weight``, ``grad_output``), which updates are pending, and statistics;
    the Philox key and next counter of its stochastic casts (``sr_seed``, ``sr_offset``: None
    until a recipe rounds stochastically); ``kept``: the GEMM stays out of the recipe (its
    module's ``keep_high_precision``)."""

    def __init__(self) -> None:
        self.states: dict = {}
        self.pending: set = set()        # "forward" / "backward": amaxes recorded, not yet used
        self.stats: dict = {role: TensorStats() for role in FORWARD_ROLES + BACKWARD_ROLES}
        self.kept = False
        self.sr_seed = 0
        self.sr_offset: int | None = None

    def use(self, recipe) -> None:
        """Before a GEMM under ``recipe``: start the stochastic counter where it rounds so
        (the dry run of ``fpsim.train`` does, so checkpoints know this state)."""
        if recipe.scaling is ScalingKind.NVFP4 and recipe.stochastic and self.sr_offset is None:
            self.sr_offset = 0

    def draw_stochastic(self, count: int) -> dict:
        """``round_to``'s stochastic options for a cast of ``count`` elements: the next
        ``count`` counters under this GEMM's key."""
        offset = 0 if self.sr_offset is None else self.sr_offset
        self.sr_offset = offset + count
        return {"mode": "stochastic", "seed": self.sr_seed, "offset": offset}

    def holds_state(self) -> bool:
        """True once a checkpoint must save this GEMM's state (``extra_state``)."""
        return bool(self.states) or self.sr_offset is not None

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
        state = {"states": {role: {"amax_history": list(s.amax_history), "scale": s.scale}
                            for role, s in sorted(self.states.items())},
                 "pending": sorted(self.pending)}
        if self.sr_offset is not None:
            state["stochastic"] = {"seed": self.sr_seed, "offset": self.sr_offset}
        return state

    def set_extra_state(self, state) -> None:
        problem = _state_problem(state)
        if problem:
            raise ValueError(f"FP8 scaling state: {problem}; expected {{'states': {{role: "
                             f"{{'amax_history': [floats], 'scale': float}}}}, 'pending': "
                             f"[subset of 'forward', 'backward'], optional 'stochastic': "
                             f"{{'seed': int, 'offset': int}}}}")
        self.states = {role: DelayedScalingState(tuple(float(v) for v in s["amax_history"]),
                                                 float(s["scale"]))
                       for role, s in state["states"].items()}
        self.pending = set(state["pending"])
        if "stochastic" in state:
            self.sr_seed = state["stochastic"]["seed"]
            self.sr_offset = state["stochastic"]["offset"]


def _state_problem(state) -> str | None:
    if not isinstance(state, dict) or set(state) - {"stochastic"} != {"states", "pending"}:
        return f"got {state!r}"
    if "stochastic" in state and _stochastic_problem(state["stochastic"]):
        return f"bad 'stochastic' {state['stochastic']!r}"
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


def _stochastic_problem(state) -> bool:
    """True unless ``state`` is ``{'seed', 'offset'}``, each an integer in [0, 2**64)."""
    if not isinstance(state, dict) or set(state) != {"seed", "offset"}:
        return True
    try:
        for name in ("seed", "offset"):
            check_count_between(name, state[name], 0, 2 ** 64 - 1)
    except (TypeError, ValueError):
        return True
    return False


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _operand(slots, role, data, recipe, recording, axis):
    """``data`` quantized as the GEMM operand ``role`` reduced along ``axis``: ``(array,
    factor)`` with ``array @ ...`` times ``factor`` the dequantized product. Per-tensor
    recipes give the FP8 values and ``scale_inv``; block recipes give the dequantized values
    (exact: their scales are powers of two) and 1. A training cast (``recording``) counts in
    the stats."""
    fmt = recipe.backward if role in BACKWARD_ROLES else recipe.forward
    if recipe.scaling is ScalingKind.NVFP4:
        array, factor, q, role = nvfp4_operand(slots, role, data, recipe, axis)
        scale = global_scale(factor)
    elif recipe.scaling in (ScalingKind.CURRENT, ScalingKind.DELAYED):
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
        stats = slots.stats.setdefault(role, TensorStats())
        stats.elements += size(data)
        stats.saturated += q.saturated
        stats.flushed += q.flushed
        stats.scale = scale
    return array, factor


def _product(a, b, model, out_fmt, recipe):
    """``round_out( fl32(acc(a[0] @ b[0]) * fl32(a[1] * b[1])) )`` for two ``_operand``s
    (the dequantization factor one fp32 multiply; inf - inf and 0 * inf are NaN, IEEE);
    under NVFP4 the factor is TE's alpha from the two amaxes (``ops_fp4``)."""
    acc = acc_matmul(a[0], b[0], FP32, model)
    factor = (nvfp4_alpha(a[1], b[1]) if recipe.scaling is ScalingKind.NVFP4
              else fl32(a[1] * b[1]))
    if factor != 1.0:
        with xp.errstate(over="ignore", invalid="ignore", under="ignore"):
            acc = acc * scalar(factor, xp.float32)
    return acc if out_fmt is FP32 else round_array(acc, out_fmt)


def _check_blocks(recipe, **lengths) -> None:
    """MX needs every reduction length to be a multiple of its 32-element blocks, NVFP4 of
    its 16-element blocks (and 16x16 weight tiles)."""
    block = {ScalingKind.MX: 32, ScalingKind.NVFP4: 16}.get(recipe.scaling)
    if block:
        bad = {name: n for name, n in lengths.items() if n % block}
        if bad:
            kind = "MX" if block == 32 else "NVFP4"
            head = recipe.name.partition(":")[0] or "mxfp8"
            raise ValueError(f"{recipe.name}: {kind} blocks are {block} elements along each "
                             f"GEMM's reduction dimension; "
                             f"{', '.join(f'{k} = {v}' for k, v in bad.items())} is not a "
                             f"multiple of {block} (use sizes divisible by {block}, keep the "
                             f"layer in bf16 by naming it in the recipe's keep key, e.g. "
                             f"--policy {head}:keep=NAME with NAME its name in "
                             f"model.named_modules(), or in code nn.Linear(..., fp8=False); "
                             f"or use a per-tensor recipe: fp8-current, fp8-delayed)")


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
    slots.use(recipe)
    recording = is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if recording:
        slots.begin("forward", recipe)
    x2 = xp.reshape(x.data, (-1, x.shape[-1]))
    qx = _operand(slots, "input", x2, recipe, recording, -1)
    qw = _operand(slots, "weight", weight.data, recipe, recording, -1)
    out = _product(qx, (qw[0].T, qw[1]), model, FP32, recipe)
    if bias is not None:
        with xp.errstate(over="ignore", invalid="ignore"):
            out = out + bias.data
    out = xp.reshape(round_array(out, fmt), x.shape[:-1] + (weight.shape[0],))
    per_tensor = recipe.scaling in (ScalingKind.CURRENT, ScalingKind.DELAYED)
    # NVFP4's 16x16 weight tiles serve both orientations; its wgrad casts are its own tensors
    reuse_weight = per_tensor or (recipe.scaling is ScalingKind.NVFP4 and recipe.tiles_2d)
    count_cols = recipe.scaling is ScalingKind.NVFP4

    def backward(g, g_fmt):
        g2 = xp.reshape(g, (-1, g.shape[-1]))
        _check_blocks(recipe, batch_rows=g2.shape[0])
        slots.begin("backward", recipe)
        qg = _operand(slots, "grad_output", g2, recipe, True, -1)
        dx = dw = db = None
        if x.requires_grad:     # per-tensor operands serve both orientations, blocks do not
            w_cols = qw if reuse_weight else _operand(slots, "weight", weight.data, recipe,
                                                     False, 0)
            dx = xp.reshape(_product(qg, w_cols, model, x.grad_fmt, recipe), x.shape)
        if weight.requires_grad:
            g_cols = qg if per_tensor else _operand(slots, "grad_output", g2, recipe,
                                                    count_cols, 0)
            x_cols = qx if per_tensor else _operand(slots, "input", x2, recipe, count_cols, 0)
            dw = _product((g_cols[0].T, g_cols[1]), x_cols, model, weight.grad_fmt, recipe)
        if bias is not None and bias.requires_grad:
            db = acc_sum(g2, 0, False, bias.grad_fmt, policy.accumulation)
        return (dx, dw) if bias is None else (dx, dw, db)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return record(out, fmt, parents, backward, "linear")
