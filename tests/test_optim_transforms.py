"""The optimizer step as a chain of transforms (``fpsim.optim.transforms``): each transform
alone does what its docstring says, the chain stops at a skipped step and keeps its states
frozen, and ``Optimizer.step`` gives the bits it gave before it was a chain (the hashes of
several steps' weights, masters, rule states and reports, pinned from the commit before)."""
import hashlib

import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor
from fpsim.formats import FP32
from fpsim.optim import SGD, Adam, AdamW, Arith, Optimizer
from fpsim.scaling import preset

from bit_patterns import same_bits

SHAPES = [(3, 4), (7,), (2, 2, 2), (1,), (0,), (5, 3)]


def trajectory_hash(rule, master, fmts, clip, scaler, steps=6, size=None) -> str:
    """sha256 of every step's weights, masters, rule state and report (NaN signs left
    out: ``_nan_blind_bytes``). Gradients are the
    true ones times the scaler's scale, with an inf on step 2 and a NaN-free tiny one on step
    4 (lost updates); ``size``: one parameter of that many elements instead of ``fmts``'s."""
    rng = np.random.default_rng(17)
    shapes = [(size,)] if size else [SHAPES[i % len(SHAPES)] for i in range(len(fmts))]
    params = [(f"p{i}", Tensor(rng.standard_normal(shape).astype(np.float32) * 4, fmt,
                               requires_grad=True))
              for i, (shape, fmt) in enumerate(zip(shapes, fmts))]
    optimizer = Optimizer(params, rule, master=master, clip_norm=clip)
    state = scaler.init() if scaler is not None else None
    digest = hashlib.sha256()
    for k in range(steps):
        scale = state.scale if state is not None else 1.0
        for _, p in params:
            true = rng.standard_normal(p.shape) * 10.0 ** rng.integers(-7 if k == 4 else -3, 1,
                                                                        p.shape)
            grad = (true * scale).astype(np.float32)
            if k == 2 and grad.size:
                grad.reshape(-1)[0] = np.inf
            p.grad = Tensor(grad, p.grad_fmt)
        with np.errstate(over="ignore", invalid="ignore"):
            report = optimizer.step(state)
        state = report.scaler_state if scaler is not None else None
        digest.update(_report_text(report).encode())
        digest.update(repr(None if state is None else (state.scale, state.skipped)).encode())
        for _, p in params:
            digest.update(_nan_blind_bytes(p.data))
        for key, value in sorted(optimizer.state_dict().items()):
            digest.update(key.encode() + _nan_blind_bytes(value))
    return digest.hexdigest()[:16]


def _report_text(report) -> str:
    """The report's repr as the pinned hashes saw it: without the per-parameter counts a step
    gives only when asked (``lost_by_parameter``, () here), and without the scaler state."""
    fields = report._replace(scaler_state=None)._asdict()
    assert fields.pop("lost_by_parameter") == ()
    return "StepReport(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def host(x):
    """An engine array (or scalar) as a host NumPy array; host data as it is."""
    return backend.to_numpy(x) if backend.is_array(x) else np.asarray(x)


def on(x):
    """Host data as a backend array of the same dtype (engine internals take these)."""
    x = np.asarray(x)
    return backend.asarray(x, getattr(backend.xp, x.dtype.name))


def _nan_blind_bytes(array) -> bytes:
    """The array's bytes with every NaN made the same NaN: the sign of a NaN that inf * 0
    makes is the machine's (x86 sets it, ARM does not), so the pinned hashes leave it out."""
    array = np.array(host(array))
    if array.dtype.kind == "f":
        array[np.isnan(array)] = np.nan
    return array.tobytes()


CASES = {
    "sgd": (SGD(lr=0.1), "fp32", ["fp16", "fp32"] * 3, None, None),
    "momentum-clip": (SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), "fp32", ["fp16"] * 6,
                      1.0, None),
    "nesterov-scaler": (SGD(lr=0.05, momentum=0.9, nesterov=True), "fp32", ["fp16"] * 4, None,
                        preset("torch", init_scale=2.0 ** 12, growth_interval=2)),
    "adam-clip-scaler": (Adam(lr=1e-3), "fp32", ["bf16", "fp32", "fp16"], 0.5,
                         preset("torch", init_scale=2.0 ** 10, growth_interval=3)),
    "adamw-no-master": (AdamW(lr=1e-2, weight_decay=0.1), None, ["bf16"] * 5, None, None),
    "sgd-no-master-fp16": (SGD(lr=1e-3), None, ["fp16"] * 3, 2.0,
                           preset("apex", init_scale=2.0 ** 8)),
    "momentum-sum-check": (SGD(lr=0.1, momentum=0.5, dampening=0.25), "fp32", ["fp16"] * 4,
                           None, preset("deepspeed", init_scale=2.0 ** 6)),
    "adam-one-large": (Adam(lr=1e-3, weight_decay=0.01), "fp32", ["fp16"], 0.1,
                       preset("torch", init_scale=2.0 ** 8)),
}
LARGE = {"adam-one-large": 70000}

#: ``trajectory_hash`` of every case on the commit before the chain (7a02fef), NumPy backend;
#: the same with the parameters updated together and one by one
PINNED = {
    "adam-clip-scaler": "5cfe17206744cacc",
    "adam-one-large": "2e46bee1e8c9c286",
    "adamw-no-master": "f372dd378b929997",
    "momentum-clip": "d2541fa40c3d0dc5",
    "momentum-sum-check": "f281df03bae159d5",
    "nesterov-scaler": "c92388d569a81e19",
    "sgd": "5db740154784dedf",
    "sgd-no-master-fp16": "bbf42a8881e00f90",
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("together_max", [None, 0])
def test_the_chain_gives_the_bits_of_the_step_before_it(case, together_max):
    """Several steps of each rule, with clipping, loss-scale skips, no master, the "sum"
    overflow test and one large parameter: the same hash as the step before the chain, with
    the parameters updated together (the default) and one by one."""
    changes = {} if together_max is None else {"together_max": together_max}
    with backend.use_tuning(**changes):
        got = trajectory_hash(*CASES[case], size=LARGE.get(case))
    assert got == PINNED[case]


# --- each transform alone ---------------------------------------------------------------------
from fpsim.exact import exact_global_norm  # noqa: E402
from fpsim.optim.transforms import (  # noqa: E402
    ApplyRule, EmptyState, Params, RuleState, StepData, StoreValues, apply_rule, chain,
    clip_by_global_norm, count_lost_updates, find_overflow, measure_global_norm,
    skip_on_overflow, store_values, unscale_gradients)
from fpsim.optim.updates import apply_updates  # noqa: E402
from fpsim.scaling import ScalerState, check_overflow, unscale  # noqa: E402


def _grads(*values):
    return [on(np.float32(v)) for v in values]


def test_find_overflow_reports_and_updates_the_scaler_state():
    state = preset("torch", init_scale=1024.0).init()
    for grads, found in [(_grads([1.0, 2.0], [3.0]), False), (_grads([1.0], [np.nan]), True)]:
        step, kept = find_overflow().update(StepData.of(grads, state), EmptyState())
        assert step.found_inf is found and kept == EmptyState()
        assert step.next_scaler_state == state.update(found) and not step.skipped
    step, _ = find_overflow().update(StepData.of(_grads([np.inf])), EmptyState())
    assert step.found_inf and step.next_scaler_state is None and not step.skipped


def test_find_overflow_sums_each_scaled_gradient_for_the_sum_test():
    """The "sum" test reads the gradients one per parameter (``scaled``) even where the
    update's layout joined them: two of sum 2e38 overflow nothing, joined they would."""
    state = preset("deepspeed", overflow_check="sum").init()
    scaled = _grads([1e38, 1e38], [1e38, 1e38])
    joined = StepData((backend.xp.concatenate(scaled),), tuple(scaled), state)
    assert check_overflow([joined.grads[0]], state)
    assert not find_overflow().update(joined, EmptyState())[0].found_inf


def test_skip_on_overflow_follows_the_scaler_and_the_chain_stops_there():
    state = preset("torch", init_scale=1024.0).init()
    w = Tensor(np.float32([1.0, 2.0]), "fp32", requires_grad=True)
    named = [("w", w)]
    steps = chain(find_overflow(), skip_on_overflow(), unscale_gradients(),
                  apply_rule(SGD(lr=1.0), "fp32"), store_values("fp32"))
    states = steps.init(named)
    params = Params((w,), states[-1].values)
    step, after = steps.update(StepData.of(_grads([np.inf, 1.0]), state), states, params)
    assert step.skipped and host(step.grads[0])[0] == np.inf and step.new == ()
    assert after[3] is states[3] and after[4] is states[4]     # later states kept as they were
    assert backend.to_list(w.data) == [1.0, 2.0]
    step, after = steps.update(StepData.of(_grads([1024.0, -2048.0]), state), states, params)
    assert not step.skipped and after[3].count == 1 and backend.to_list(after[4].values[0]) \
        == [0.0, 4.0]
    assert backend.to_list(w.data) == [1.0, 2.0]               # the chain writes no weight
    alone, _ = skip_on_overflow().update(StepData.of([])._replace(found_inf=True),
                                         EmptyState())
    assert not alone.skipped                                  # no scaler: nothing skipped


def test_unscale_gradients_is_the_scalers_unscale_and_writes_nothing():
    grads = _grads([3.0, -0.0, 2.0 ** -149], [np.inf])
    before = [backend.copy(g) for g in grads]
    for scaler in (preset("torch"), preset("keras3")):
        state = ScalerState(scaler=scaler, scale=3.0)
        step, _ = unscale_gradients().update(StepData.of(grads, state), EmptyState())
        for got, expected in zip(step.grads, unscale(grads, state)):
            assert same_bits(host(got), host(expected))
        assert all(same_bits(host(g), host(b)) for g, b in zip(grads, before))
    step = StepData.of(grads)
    assert unscale_gradients().update(step, EmptyState())[0] is step     # no scaler


def test_measure_global_norm_is_the_correctly_rounded_norm():
    rng = np.random.default_rng(1)
    grads = [(rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30)).astype(np.float32)
             for n in (5, 300, 1)]
    grads = [on(g) for g in grads]
    step, _ = measure_global_norm().update(StepData.of(grads), EmptyState())
    assert same_bits(np.float32(host(step.grad_norm)),
                     np.float32(host(exact_global_norm(grads))))


@pytest.mark.parametrize("max_norm,clipped", [(1.0, True), (5.0, True), (5.000005, False),
                                              (100.0, False)])
def test_clip_by_global_norm_is_torchs_rule(max_norm, clipped):
    """coef = fp32(max_norm) / (norm + fp32(1e-6)); below 1 every gradient is multiplied by
    it (5.0 clips: 5 / (5 + 1e-6) < 1), else the gradients are the very same arrays."""
    grads = _grads([3.0, 0.0], [-4.0])
    step, _ = clip_by_global_norm(max_norm).update(StepData.of(grads), EmptyState())
    coef = np.float32(max_norm) / (np.float32(5.0) + np.float32(1e-6))
    assert step.clipped is clipped and float(host(step.grad_norm)) == 5.0
    if clipped:
        assert all(same_bits(host(g), host(x) * coef) for g, x in zip(step.grads, grads))
    else:
        assert all(g is x for g, x in zip(step.grads, grads))
    measured = StepData.of(grads)._replace(
        grad_norm=backend.scalar(10.0, backend.xp.float32))          # the norm given
    step, _ = clip_by_global_norm(5.0).update(measured, EmptyState())
    assert host(step.grad_norm) == 10.0 and host(step.grads[0])[0] == np.float32(3.0) * (
        np.float32(5.0) / (np.float32(10.0) + np.float32(1e-6)))


def test_clip_by_global_norm_refuses_what_float32_cannot_hold():
    with pytest.raises(ValueError, match="clip_norm"):
        clip_by_global_norm(0.0)


@pytest.mark.parametrize("rule", [SGD(lr=0.1, momentum=0.9), Adam(lr=1e-2)])
@pytest.mark.parametrize("master", ["fp32", None])
def test_apply_rule_is_the_rule_per_parameter_or_flat(rule, master):
    """One parameter at a time: ``rule.apply`` in the update's format (the master's, or the
    weight's own), the step number counted in the state; together (one flat array): the
    same bits, the state of each parameter a view of the flat state."""
    from fpsim.optim.flat import join
    rng = np.random.default_rng(2)
    params = [Tensor(Arith("bf16").round(on(rng.standard_normal(s))), "bf16")
              for s in ((2, 3), (4,))]
    named = [(str(i), p) for i, p in enumerate(params)]
    grads = [Arith("bf16").round(on(rng.standard_normal(p.shape))) for p in params]
    transform = apply_rule(rule, master)
    state = transform.init(named)
    stored = tuple(p.data for p in params)
    ops = Arith(master or "bf16")
    for count in (1, 2):
        step, state = transform.update(StepData.of(grads), state, Params(tuple(params), stored))
        assert state.count == count and state.flat is None
        assert [tuple(new.shape) for new in step.new] == [p.shape for p in params]
        stored = step.new
    expected = [rule.apply(ops, s, g, rule.init(s), 1).param for s, g in
                zip((p.data for p in params), grads)]
    together = apply_rule(rule, master)
    joined_step = StepData((join(grads),), tuple(grads))
    step, flat_state = together.update(joined_step, together.init(named),
                                       Params(tuple(params), (join([p.data for p in params]),),
                                              Arith(master or "bf16").fmt))
    assert same_bits(host(step.new[0]), host(join(expected))) and flat_state.count == 1
    for per_parameter, p in zip(flat_state.states, params):
        for value, whole in zip(per_parameter, flat_state.flat):
            assert value is None or (tuple(value.shape) == p.shape
                                     and backend.xp.shares_memory(value, whole))


def test_count_lost_updates_counts_moved_and_unchanged_elements():
    from fpsim.optim import Update
    stored = on(np.float32([1.0, 1.0, 2.0, 0.0, 5.0]))
    direction = on(np.float32([1.0, 2.0 ** -30, 0.0, np.nan, -1.0]))
    new = on(np.float32([0.5, 1.0, 2.0, np.nan, 5.5]))
    result = Update(new, direction, on(np.float32(-0.5)), None)
    step = StepData.of([])._replace(new=(new,), results=(result,))
    step, _ = count_lost_updates().update(step, EmptyState(), Params((), (stored,)))
    assert (step.updates, step.lost_updates) == (4, 1)      # 2**-31 under 1's half ulp
    counted = result._replace(counts=(7, 3))                  # the rule's own count wins
    step = step._replace(results=(counted,))
    counted_step = count_lost_updates().update(step, EmptyState(), Params((), (stored,)))[0]
    assert (counted_step.updates, counted_step.lost_updates) == (7, 3)
    # per parameter, from one flat update of two parameters (2 and 3 elements): each slice
    # counted on its own, whatever the rule counted for the whole
    two = (Tensor(np.zeros(2, np.float32)), Tensor(np.zeros(3, np.float32)))
    step = step._replace(per_parameter=True)
    each = count_lost_updates().update(step, EmptyState(), Params(two, (stored,), FP32))[0]
    assert each.lost_by_parameter == ((2, 1), (2, 0))


def test_store_values_keeps_masters_and_writes_no_weight():
    w16 = Tensor(np.float32([1.0, 2.0]), "fp16")
    w32 = Tensor(np.float32([3.0]), "fp32")
    named = [("a", w16), ("b", w32)]
    transform = store_values("fp32")
    state = transform.init(named)
    assert [backend.to_list(m) for m in state.values] == [[1.0, 2.0], [3.0]]
    assert not backend.xp.shares_memory(state.values[1], w32.data)        # copies
    new = (on(np.float32([1 + 2.0 ** -12, 2.0])), on(np.float32([3.5])))
    step = StepData.of([])._replace(new=new)
    before = (w16.data, w32.data)
    _, state = transform.update(step, state, Params((w16, w32), state.values))
    assert state.values == new and state.flat is None
    assert (w16.data, w32.data) == before                                  # pure
    flat = on(np.float32([1.0, 2.0, 3.0]))
    _, joined = transform.update(StepData.of([])._replace(new=(flat,)), state,
                                 Params((w16, w32), (flat,), FP32))
    assert joined.flat is flat and [backend.to_list(v) for v in joined.values] == [
        [1.0, 2.0], [3.0]] and backend.xp.shares_memory(joined.values[1], flat)
    with pytest.raises(ValueError, match="'x' .* does not fit the master format"):
        store_values("fp16").init([("x", Tensor(np.float32([0.1]), "fp32"))])
    plain = store_values(None)
    assert plain.init(named).values == ()
    assert plain.update(step, plain.init(named), Params((w16, w32), ()))[1].values == new


def test_apply_updates_rounds_into_the_weights_or_takes_the_array():
    w16 = Tensor(np.float32([1.0, 2.0]), "fp16")
    w32 = Tensor(np.float32([3.0]), "fp32")
    new = (on(np.float32([1 + 2.0 ** -12, 2.0])), on(np.float32([3.5])))
    apply_updates((w16, w32), new, FP32)
    assert backend.to_list(w16.data) == [1.0, 2.0] and w32.data is new[1]  # fp16 rounds
    signalling = np.float32([0.0]).view(np.uint32) | np.uint32(0x7F800001)
    with_nan = on(signalling.view(np.float32))
    apply_updates((w16, w32), (new[0], with_nan), FP32)
    assert w32.data is not with_nan and np.isnan(host(w32.data)[0])        # NaN: round_to
    flat = on(np.float32([1.5, 2.5, 4.0]))
    parts = (flat[:2], flat[2:])
    apply_updates((w16, w32), parts, FP32, flat=flat)
    assert w32.data is parts[1] and backend.to_list(w16.data) == [1.5, 2.5]
    apply_updates((w16, w32), new, None)                                   # no master
    assert w16.data is new[0] and w32.data is new[1]
    with pytest.raises(ValueError, match="one value per tensor, got 1 values for 2"):
        apply_updates((w16, w32), new[:1], FP32)


def test_the_chain_states_are_frozen():
    """A step makes new states and changes no array of the old ones (jmp's rule): the old
    chain state can be held and looked at after any number of steps."""
    w = Tensor(np.float32([1.0, -1.0]), "fp32", requires_grad=True)
    optimizer = Optimizer([w], Adam(lr=0.1), clip_norm=1.0)
    w.grad = Tensor(np.float32([1.0, 2.0]), "fp32")
    optimizer.step()
    before = optimizer.chain_state
    copies = [(s.count, [backend.copy(a) for st in s.states for a in st])
              if isinstance(s, RuleState)
              else [backend.copy(v) for v in getattr(s, "values", ())] for s in before]
    for _ in range(3):
        optimizer.step()
    assert optimizer.chain_state is not before and optimizer.step_count == 4
    for s, copied in zip(before, copies):
        if isinstance(s, RuleState):
            assert s.count == copied[0]
            assert all(same_bits(host(a), host(c)) for a, c in
                       zip((a for st in s.states for a in st), copied[1]))
        else:
            assert all(same_bits(host(v), host(c))
                       for v, c in zip(getattr(s, "values", ()), copied))
    kinds = [type(t).__name__ for t in optimizer.transform.transforms]
    assert kinds == ["FindOverflow", "SkipOnOverflow", "UnscaleGradients",
                     "MeasureGlobalNorm", "ClipByGlobalNorm", "ApplyRule",
                     "CountLostUpdates", "StoreValues"]
    assert optimizer.transform.index(ApplyRule) == 5
    assert optimizer.transform.index(StoreValues) == 7
