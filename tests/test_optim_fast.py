"""The optimizer's fast paths against their straightforward references: ``Arith.fma`` in
chunks (boundaries, broadcasting, ties at grid points, midpoints and below the smallest
normal, NaN payloads), ``Update.moved`` against ``intended != 0``, the rounded-scalar cache,
and ``global_norm`` over chunk boundaries."""
import numpy as np
import pytest

from fpsim import backend
from fpsim.exact import exact_global_norm, global_norm
from fpsim.optim import SGD, Adam, Arith, Optimizer, Update
from fpsim.optim.arith import fma_round_to_odd
from fpsim.autograd import Tensor
from fpsim.rounding import round_to

from bit_patterns import same_bits

FORMATS = ["fp32", "bf16", "fp16", "fp8_e4m3"]


def host(x):
    """An engine result (a backend array or scalar) or host data as a host NumPy array."""
    return backend.to_numpy(x) if backend.is_array(x) else np.asarray(x)


def _on(x):
    """Host operands (NumPy arrays and scalars) as backend arrays of the same dtype; backend
    values and Python numbers as they are."""
    if backend.is_array(x) or isinstance(x, (int, float)):
        return x
    x = np.asarray(x)
    return backend.asarray(x, getattr(backend.xp, x.dtype.name))


def _reference(ops, a, b, c):
    with np.errstate(invalid="ignore"):          # signalling NaNs widen with a warning
        a, b, c = np.broadcast_arrays(*(np.asarray(host(v), np.float64) for v in (a, b, c)))
    return ops.round(fma_round_to_odd(_on(a), _on(b), _on(c)))


def _bits(x):
    return np.ascontiguousarray(np.asarray(host(x), np.float32)).view(np.uint32)


def _values(ops, rng, shape):
    """Values of the format, as a host float32 array (tests change elements before use)."""
    return host(ops.round(_on(rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape))))


@pytest.fixture
def small_chunks():
    with backend.use_tuning(arith_chunk=64, norm_chunk=64):
        yield


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 1000])
def test_fma_across_chunk_boundaries(small_chunks, fmt, n):
    ops = Arith(fmt)
    rng = np.random.default_rng(n)
    a, b, c = (_values(ops, rng, n) for _ in range(3))
    b[::7] = 0.0                                  # zero products: c itself, a grid point
    for args in [(a, b, c), (ops.scalar(-0.01), b, c), (a, ops.scalar(0.5), c),
                 (a, b, ops.scalar(1.0)), (a[0], b[0], c)]:
        assert np.array_equal(_bits(ops.fma(*map(_on, args))), _bits(_reference(ops, *args)))


def test_fma_broadcasts_and_keeps_shapes():
    ops = Arith("fp32")
    rng = np.random.default_rng(1)
    a, b, c = _values(ops, rng, (3, 1)), _values(ops, rng, (1, 4)), _values(ops, rng, (4,))
    out = ops.fma(_on(a), _on(b), _on(c))
    assert tuple(out.shape) == (3, 4) and out.dtype == backend.xp.float32
    assert np.array_equal(_bits(out), _bits(_reference(ops, a, b, c)))
    scalar = ops.fma(_on(np.float32(2.0)), _on(np.float32(3.0)), 1.0)
    assert tuple(scalar.shape) == () and float(host(scalar)) == 7.0
    assert tuple(ops.fma(_on(np.zeros(0, np.float32)), 1.0, 0.0).shape) == (0,)


@pytest.mark.parametrize("scale", [2.0 ** k for k in (-100, -1, 0, 60)])
def test_fma_ties_grid_points_and_near_misses(small_chunks, scale):
    # c odd (last bit set); a*b = 2**-24 (1 -+ 2**-46) * c's binade: the float64 sum lands on
    # the midpoint c + half an ulp while the exact sum lies just below (or above) it
    ops = Arith("fp32")
    a = np.float32(1 + 2.0 ** -23)
    below = np.float32((1 - 2.0 ** -23) * 2.0 ** -24 * scale)
    c = np.full(150, (1 + 2.0 ** -23) * scale, np.float32)
    b = np.zeros(150, np.float32)
    b[::3], b[1::3] = below, -below               # ties on both sides; zeros: grid points
    got = host(ops.fma(_on(a), _on(b), _on(c)))
    assert np.array_equal(_bits(got), _bits(_reference(ops, a, b, c)))
    assert np.all(got == c)                       # the exact sums all round back to c


def test_fma_tie_below_the_smallest_normal():
    # c = 513 * 2**-149 (an fp32 subnormal), a*b = 2**-150 (1 - 2**-46): the float64 sum is
    # the midpoint 1027 * 2**-150, whose low bits look like a grid point's; the exact sum is
    # below it, so the answer is c (a tie-to-even cast would give 514 * 2**-149)
    ops = Arith("fp32")
    a = np.float32([(1 + 2.0 ** -23) * 2.0 ** -100])
    b = np.float32([(1 - 2.0 ** -23) * 2.0 ** -50])
    c = np.float32([513 * 2.0 ** -149])
    naive = np.float32(a.astype(np.float64) * b + c.astype(np.float64))
    assert naive != c
    assert _bits(ops.fma(_on(a), _on(b), _on(c))) == _bits(c)


@pytest.mark.parametrize("fmt", ["fp32", "fp16"])
def test_fma_nan_payloads_and_infinities(small_chunks, fmt):
    ops = Arith(fmt)
    rng = np.random.default_rng(7)
    n = 300
    b, c = _values(ops, rng, n), _values(ops, rng, n)
    payloads = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFA00000, 0x7FFFFFFF],
                        np.uint32).view(np.float32)
    b[rng.integers(0, n, 20)] = rng.choice(payloads, 20)
    c[rng.integers(0, n, 20)] = rng.choice(payloads, 20)
    b[rng.integers(0, n, 10)] = np.inf
    c[rng.integers(0, n, 10)] = -np.inf
    for a in (np.float32(-0.01), np.float32(0.0)):
        assert np.array_equal(_bits(ops.fma(_on(a), _on(b), _on(c))),
                              _bits(_reference(ops, a, b, c)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_fma_bits_do_not_depend_on_the_chunk(fmt):
    ops = Arith(fmt)
    rng = np.random.default_rng(3)
    a, b, c = (_values(ops, rng, 5000) for _ in range(3))
    b[::11] = np.nan
    c[::13] = np.nan
    a, b, c = _on(a), _on(b), _on(c)
    whole = ops.fma(a, b, c)
    with backend.use_tuning(arith_chunk=256):
        assert np.array_equal(_bits(ops.fma(a, b, c)), _bits(whole))


def test_scalars_keep_the_sign_of_zero():
    ops = Arith("fp16")
    assert np.signbit(host(ops.scalar(-0.0))) and not np.signbit(host(ops.scalar(0.0)))
    assert host(ops.scalar(-1e-30)) == 0 and np.signbit(host(ops.scalar(-1e-30)))
    assert host(ops.scalar(0.1)) == np.float32(0.0999755859375)


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_scalars_are_round_to(fmt):
    rng = np.random.default_rng(2)
    values = [0.1, -0.01, 2.0 ** -150, -(2.0 ** -150), 1.5 * 2.0 ** -149, 3.5e38, 1e39, -1e39,
              0.0, -0.0, np.inf, np.nan] + list(rng.standard_normal(500) * 10.0 ** rng.integers(
                  -50, 40, 500))
    ops = Arith(fmt)
    for v in values:
        assert _bits(ops.scalar(v)) == _bits(round_to(float(v), fmt)), v


@pytest.mark.parametrize("factor", [-0.01, 0.0, -0.0, 1.0, np.inf, np.nan])
def test_moved_is_intended_nonzero(factor):
    direction = np.float32([0.0, -0.0, 1.0, -2.0 ** -149, np.inf, -np.inf, np.nan, 3e38])
    update = Update(_on(direction), _on(direction), _on(np.float32(factor)), None)
    with np.errstate(invalid="ignore"):
        expected = host(update.intended) != 0
    assert np.array_equal(host(update.moved()), expected)


# lr=1e-10: float32 keeps it (a smaller one is refused), fp16 (master=None) makes it 0
@pytest.mark.parametrize("rule", [SGD(lr=0.01), SGD(lr=1e-10), SGD(lr=0.1, momentum=0.9),
                                  Adam(lr=1e-3)])
@pytest.mark.parametrize("master", ["fp32", None])
def test_lost_update_counts_match_the_float64_increment(small_chunks, rule, master):
    rng = np.random.default_rng(5)
    w = Tensor(host(Arith("fp16").round(_on(rng.standard_normal(500)))), "fp16",
               requires_grad=True)
    opt = Optimizer([w], rule, master=master)
    for step in range(3):
        grad = host(Arith("fp16").round(_on(rng.standard_normal(500)
                                            * 2.0 ** rng.integers(-30, 0, 500))))
        grad[::5] = 0.0
        if step == 2:
            grad[::17] = np.nan
        stored = backend.copy(opt.masters["0"] if master else w.data)
        ops = Arith(master or "fp16")
        expected = rule.apply(ops, stored, _on(grad), opt.states["0"], opt.step_count + 1)
        with np.errstate(invalid="ignore"):
            moved = host(expected.intended) != 0
        w.grad = Tensor(grad, "fp16")
        report = opt.step()
        new = host(opt.masters["0"] if master else w.data)
        assert report.updates == int(moved.sum())
        assert report.lost_updates == int((moved & (new == host(stored))).sum())


@pytest.mark.parametrize("sizes", [[1], [63, 64, 65], [200, 3, 1000]])
def test_global_norm_across_chunk_boundaries(small_chunks, sizes):
    rng = np.random.default_rng(len(sizes))
    grads = [(rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60)).astype(np.float32)
             for n in sizes]
    assert (_bits(global_norm([_on(g) for g in grads]))
            == _bits(exact_global_norm([_on(g) for g in grads])))
    grads[-1][-1] = np.nan
    assert np.isnan(host(global_norm([_on(g) for g in grads])))


def test_weights_in_the_master_format_are_the_master_array():
    """fp32 weights under an fp32 master: after a step p.data is the master (no copy), and
    the next step starts from the same values either way."""
    import numpy as np

    from fpsim.autograd import Tensor
    from fpsim.optim import SGD, Optimizer

    w = Tensor(np.float32([1.0, -2.0, 3.0]), "fp32", requires_grad=True)
    opt = Optimizer([w], SGD(lr=0.5))
    w.grad = Tensor(np.float32([1.0, 2.0 ** -30, 0.0]), "fp32")
    opt.step()
    assert w.data is opt.masters["0"]
    assert backend.to_list(w.data) == [0.5, -2.0, 3.0]
    w.grad = Tensor(np.float32([1.0, 1.0, 1.0]), "fp32")
    opt.step()
    assert backend.to_list(w.data) == [0.0, -2.5, 2.5]


def test_unscale_without_copy_gives_the_inputs_back_only_at_scale_one():
    """The optimizer reads the unscaled gradients only: at inv_scale 1 it takes the inputs
    themselves (copy=False); every other case gives the same new arrays as before."""
    from fpsim.scaling import NoScaler, ScalerState, preset, unscale
    grads = [backend.asarray(g) for g in ([3.0, -0.0, np.inf], [2.0 ** -149, np.nan])]
    one = NoScaler().init()
    assert all(u is g for u, g in zip(unscale(grads, one, copy=False), grads))
    copied = unscale(grads, one)
    assert all(u is not g and _bits(u).tolist() == _bits(g).tolist()
               for u, g in zip(copied, grads))
    for state, fmt in [(one, "fp16"), (ScalerState(scaler=preset("torch"), scale=8.0), None),
                       (ScalerState(scaler=preset("keras3"), scale=3.0), None)]:
        with np.errstate(over="ignore", invalid="ignore"):
            fast, slow = unscale(grads, state, fmt, copy=False), unscale(grads, state, fmt)
        for f, s, g in zip(fast, slow, grads):
            assert f is not g and _bits(f).tolist() == _bits(s).tolist()


def test_optimizer_step_at_scale_one_matches_the_unscaled_step():
    from fpsim.scaling import NoScaler
    rng = np.random.default_rng(5)
    start = rng.standard_normal(50).astype(np.float32)
    grad = (rng.standard_normal(50) * 1e-3).astype(np.float32)
    runs = []
    for state in (None, NoScaler().init()):
        w = Tensor(start, "fp32", requires_grad=True)
        w.grad = Tensor(grad, "fp32")
        report = Optimizer([w], SGD(lr=0.1, momentum=0.9)).step(state)
        assert _bits(w.grad.data).tolist() == _bits(grad).tolist()   # the gradient untouched
        runs.append((_bits(w.data).tolist(), report.updates, report.lost_updates))
    assert runs[0] == runs[1]


def _run_steps(rule, master, fmts, clip, grads_per_step, scaler):
    rng = np.random.default_rng(11)
    params = []
    for i, fmt in enumerate(fmts):
        shape = [(3, 4), (7,), (2, 2, 2), (1,), (0,)][i % 5]
        params.append((f"p{i}", Tensor(rng.standard_normal(shape) * 4, fmt, requires_grad=True)))
    opt = Optimizer(params, rule, master=master, clip_norm=clip)
    state = scaler.init() if scaler is not None else None
    reports = []
    for grads in grads_per_step:
        for (_, p), g in zip(params, grads):
            p.grad = Tensor(g[:p.size].reshape(p.shape), p.grad_fmt)
        with np.errstate(over="ignore", invalid="ignore"):
            report = opt.step(state)
        state = report.scaler_state if scaler is not None else None
        reports.append(report._replace(scaler_state=None))
    return params, opt, reports


@pytest.mark.parametrize("rule", [SGD(lr=0.1), SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
                                  SGD(lr=0.05, momentum=0.9, nesterov=True),
                                  Adam(lr=1e-3), Adam(lr=1e-3, weight_decay=0.1, decoupled=True)],
                         ids=["sgd", "momentum", "nesterov", "adam", "adamw"])
@pytest.mark.parametrize("master,fmts", [("fp32", ["fp32"] * 5), ("fp32", ["fp16", "fp32"] * 3),
                                         (None, ["bf16"] * 4), (None, ["fp16", "fp32"])],
                         ids=["fp32", "mixed-formats", "bf16-no-master", "no-master-mixed"])
def test_update_together_is_the_update_one_by_one(rule, master, fmts):
    """All parameters as one flat array (``fpsim.optim.flat``) against one parameter at a
    time: the same weights, masters, rule states and reports, NaN and inf included."""
    from fpsim.scaling import preset
    rng = np.random.default_rng(3)
    steps = []
    for k in range(4):
        grads = [(rng.standard_normal(12) * 10.0 ** rng.integers(-8, 2, 12)).astype(np.float32)
                 for _ in fmts]
        if k == 2:
            grads[0][1] = np.nan                 # a skipped step (scaler) or NaN weights
        if k == 3:
            grads[-1][0] = 0.0
        steps.append(grads)
    for clip, scaler in [(None, None), (0.5, preset("torch"))]:
        runs = []
        for limit in (backend.tuning().together_max, 0):
            with backend.use_tuning(together_max=limit):
                runs.append(_run_steps(rule, master, fmts, clip, steps, scaler))
                together = Optimizer([Tensor([1.0], fmt) for fmt in fmts], rule, master=master)
                assert (together.together_format() is not None) == (
                    limit > 0 and (master is not None or len(set(fmts)) == 1))
        (params_a, opt_a, rep_a), (params_b, opt_b, rep_b) = runs
        assert str(rep_a) == str(rep_b)           # NaN norms of skipped steps print alike
        for (_, a), (_, b) in zip(params_a, params_b):
            assert a.data.shape == b.data.shape and same_bits(host(a.data), host(b.data))
        for key, value in opt_a.state_dict().items():
            assert same_bits(host(value), host(opt_b.state_dict()[key])), key


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 64, 200, 1000])
def test_fma_counted_counts_what_moved_and_the_optimizer_count(small_chunks, fmt, n):
    """``fma_counted``'s counts, taken chunk by chunk, against ``Update.moved`` and the
    optimizer's comparison of the result with the stored values, for every kind of factor
    (zero, signed zeros, inf, NaN) and directions with zeros, infs and NaNs."""
    ops = Arith(fmt)
    rng = np.random.default_rng(n)
    c = _values(ops, rng, n)
    b = _values(ops, rng, n)
    b[::5] = 0.0
    b[1::17] = np.inf
    b[2::19] = np.nan
    b[3::23] = -0.0
    b, c_host, c = _on(b), c, _on(c)
    for factor in [0.1, -1e-3, 0.0, -0.0, np.inf, np.nan, 1e-30]:
        a = ops.scalar(factor)
        with np.errstate(over="ignore", invalid="ignore"):
            out, moved, kept = ops.fma_counted(a, b, c)
            expected = ops.fma(a, b, c)
            update = Update(expected, b, a, None)
            mask = host(update.moved())
        assert _bits(out).tolist() == _bits(expected).tolist()
        assert (moved, kept) == (int(mask.sum()),
                                 int((mask & (host(expected) == c_host)).sum())), factor


def test_sgd_counts_its_lost_updates_as_the_optimizer_does():
    rng = np.random.default_rng(2)
    ops = Arith("fp16")
    param = ops.round(_on(rng.standard_normal(300) * 100))
    grad = host(ops.round(_on(rng.standard_normal(300) * 1e-3)))
    grad[::7] = 0.0
    grad, grad_host = _on(grad), grad
    for rule in (SGD(lr=0.01), SGD(lr=0.01, momentum=0.9, weight_decay=1e-4)):
        result = rule.apply(ops, param, grad, rule.init(param), 1)
        mask = host(result.moved())
        assert result.counts == (int(mask.sum()),
                                 int((mask & (host(result.param) == host(param))).sum()))
        assert result.counts[1] > 0
        as_float64 = rule.apply(ops, param, _on(grad_host.astype(np.float64)), rule.init(param),
                                1)
        assert (as_float64.counts is None) == (rule.weight_decay == 0)  # wd: fma's float32
        assert _bits(as_float64.param).tolist() == _bits(result.param).tolist()


def test_update_together_rejoins_only_what_changed():
    """After a one-pass step the masters and momentum buffers are views of the flat results
    the chain's (frozen) states keep, which the next step takes as they are; an array
    replaced in between is joined anew, and without a master the weights the model holds
    are what the next step updates."""
    from fpsim.optim.flat import rejoin
    from fpsim.optim.transforms import ApplyRule, StoreValues
    rng = np.random.default_rng(4)
    params = [Tensor(rng.standard_normal(s), "fp32", requires_grad=True) for s in (5, (2, 3))]
    opt = Optimizer(params, SGD(lr=0.1, momentum=0.9))
    for p in params:
        p.grad = Tensor(rng.standard_normal(p.shape), "fp32")
    opt.step()
    written = opt.chain_state[opt.transform.index(StoreValues)]
    rule_state = opt.chain_state[opt.transform.index(ApplyRule)]
    masters = [opt.masters[str(i)] for i in range(2)]
    xp = backend.xp
    assert all(m is v and xp.shares_memory(m, written.flat)
               for m, v in zip(masters, written.values))
    assert rejoin(masters, written.joined) is written.flat
    assert all(xp.shares_memory(opt.states[str(i)].momentum_buffer,
                                rule_state.flat.momentum_buffer) for i in range(2))
    replaced = backend.copy(masters[0])
    joined = rejoin([replaced, masters[1]], written.joined)
    assert joined is not written.flat and np.array_equal(host(joined), host(written.flat))

    weights = [Tensor(np.float32([1.0, 2.0]), "fp32", requires_grad=True) for _ in range(2)]
    plain = Optimizer(weights, SGD(lr=1.0), master=None)
    assert plain.together_format() is not None
    for w in weights:
        w.grad = Tensor(np.float32([0.5, 0.5]), "fp32")
    plain.step()
    weights[0].data = _on(np.float32([10.0, 20.0]))
    plain.step()
    assert (backend.to_list(weights[0].data) == [9.5, 19.5]
            and backend.to_list(weights[1].data) == [0.0, 1.0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_fma_counted_zero_products_over_ties_and_signed_zeros(small_chunks, fmt):
    """Zero products over c on a midpoint of the format's grid, below its smallest normal and
    zeros of both signs: ``fma_counted`` rounds and counts as the reference does."""
    ops = Arith(fmt)
    f = ops.fmt
    ulp = 2.0 ** -f.man_bits
    c = np.float32([1 + ulp / 2, 1 + 1.5 * ulp, -(1 + ulp / 2), f.min_normal * 0.75, 0.0,
                    -0.0, -0.0, 0.0, 3.0, np.nan] * 13)
    b = np.float32([0.0, -0.0, 0.0, 0.0, -0.0, 0.0, -0.0, 0.0, 2.0 ** -30, 0.0] * 13)
    for a in (ops.scalar(0.5), ops.scalar(-0.25), ops.scalar(0.0)):
        with np.errstate(invalid="ignore"):
            out, moved, kept = ops.fma_counted(a, _on(b), _on(c))
            expected = _reference(ops, a, b, c)
        assert _bits(out).tolist() == _bits(expected).tolist(), (fmt, float(host(a)))
        assert _bits(ops.fma(a, _on(b), _on(c))).tolist() == _bits(expected).tolist()
        mask = host(Update(expected, _on(b), a, None).moved())
        assert (moved, kept) == (int(mask.sum()), int((mask & (host(expected) == c)).sum()))


def test_joined_overflow_check_is_per_element_only():
    """Many small parameters are checked for overflow on their joined gradient only where
    the test looks at each element ("nonfinite"); DeepSpeed's float32 sum stays per gradient:
    two gradients of sum 2e38 each overflow nothing, though together they would."""
    from fpsim.scaling import preset
    for check, found in (("sum", False), ("nonfinite", False)):
        params = [Tensor(np.float32([1.0, 2.0]), "fp32", requires_grad=True) for _ in range(3)]
        for p in params:
            p.grad = Tensor(np.float32([1e38, 1e38]), "fp32")
        params[2].grad = Tensor(np.float32([0.0, 0.0]), "fp32")
        optimizer = Optimizer(params, SGD(lr=0.01))
        assert optimizer.together_format() is not None
        state = preset("deepspeed", overflow_check=check).init()
        assert optimizer.step(state).found_inf is found
    params[0].grad = Tensor(np.float32([np.inf, 0.0]), "fp32")
    assert optimizer.step(preset("deepspeed", overflow_check="nonfinite").init()).found_inf
