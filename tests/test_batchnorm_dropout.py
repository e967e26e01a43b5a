"""batch_norm / nn.BatchNorm2d (buffers, train/eval) and dropout / nn.Dropout.

Dropout: the mask is Philox4x32-10 (``fpsim.rounding.philox_uniforms``, the host reference of
``backend.uniforms``); the arithmetic is PyTorch's CPU ``_dropout`` (x * noise, noise =
1/(1-p) in x's dtype), so where both keep an element the values are equal bit for bit.

BatchNorm: against MPFR (gmpy2, 300 bits) in 32-true (a float64 evaluation rounded once, so
this shows it correctly rounded on these data, not in general), and against PyTorch's fp32
CPU kernels within first-order running error bounds (u = 2**-24, gamma_k = k u / (1 - k u);
accumulations bounded as fp32 sums, which PyTorch's double accumulators only tighten), from
PyTorch's own saved mean m' and inverse std r' (``torch.native_batch_norm``), plus the
computed effect of m', r' against the exact m, r, plus our own rounding u |exact| and 2**-40
of the magnitudes for the float64 evaluations:

- forward, y = x (r' w) + (b - m' (r' w)) or (x - m') r' w + b: at most 4 roundings on terms
  bounded by (|x| + |m'|) r' |w| and |b|: gamma_4 of their sum.
- backward (PyTorch: S = sum dy, D = sum (x - m') dy, k = D r'**2 / M, dx = (dy - S/M -
  (x - m') k) r' w, dw = D r', db = S): the running bound of those steps (``_torch_backward``).
- running statistics (PyTorch: m_run = mom' m' + (1 - mom') m_run, v_run = mom' var_sum' /
  (M - 1) + (1 - mom') v_run, mom' = float32(momentum)): 3 roundings each (gamma_3), var_sum'
  within gamma_(M+2) of the exact sum of squares plus M (|m' - m| + u |m|)**2 (the centring
  mean's own error).
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy
from fpsim.rounding import philox_uniforms, round_to

U = 2.0 ** -24
SECOND_ORDER = 1 + 2.0 ** -10
SLACK = 2.0 ** -40
EPS = 1e-5


def gamma(k):
    return k * U / (1 - k * U)


def _np(t):
    return backend.to_numpy(t.data)


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


# --- dropout -------------------------------------------------------------------------------

def test_dropout_mask_is_philox_and_values_are_torchs_arithmetic():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 50)).astype(np.float32)
    g = rng.standard_normal((8, 50)).astype(np.float32)
    for p, fmt, dtype in ((0.3, "fp32", torch.float32), (0.37, "fp16", torch.float16),
                          (0.1, "bf16", torch.bfloat16)):
        t = Tensor(x, fmt, requires_grad=True)
        y = ag.dropout(t, p, seed=11, offset=123)
        keep = (philox_uniforms(11, 123, x.size) >= p).reshape(x.shape)
        tx = torch.tensor(_np(t)).to(dtype).requires_grad_()
        noise = torch.tensor(keep.astype(np.float32)).to(dtype).div_(1 - p)   # torch's _dropout
        ty = tx * noise
        np.testing.assert_array_equal(_bits(_np(y)), _bits(ty.detach().float().numpy()))
        y.backward(Tensor(g, fmt))
        ty.backward(torch.tensor(_np(Tensor(g, fmt))).to(dtype))
        np.testing.assert_array_equal(_bits(_np(t.grad)), _bits(tx.grad.float().numpy()))
        # and torch's own F.dropout: equal wherever both keep the element
        torch.manual_seed(0)
        theirs = torch.nn.functional.dropout(tx.detach(), p, True).float().numpy()
        both = keep & (theirs != 0)
        assert both.sum() > 100
        np.testing.assert_array_equal(_np(y)[both], theirs[both])


def test_dropout_module_train_eval_and_counters():
    x = Tensor(np.ones((100, 200)))
    drop = nn.Dropout(0.25, seed=5)
    model = nn.Sequential(nn.Linear(200, 200, rng=0), drop)
    first = _np(drop(x))
    assert drop.offset == x.size
    second = _np(drop(x))
    assert not np.array_equal(first == 0, second == 0)           # a new counter range
    fraction = float(np.mean(first == 0))
    assert abs(fraction - 0.25) < 5 * np.sqrt(0.25 * 0.75 / x.size)
    scale = np.float32(1) / np.float32(0.75)
    assert set(np.unique(first).tolist()) == {0.0, float(scale)}
    model.eval()
    assert not drop.training and not model[0].training
    np.testing.assert_array_equal(_np(drop(x)), _np(x))
    model.train()
    assert drop.training
    again = nn.Dropout(0.25, seed=5)
    np.testing.assert_array_equal(_np(again(x)), first)         # same seed, same offset
    assert np.all(_np(ag.dropout(Tensor([1.0, -2.0]), 1.0, seed=0)) == 0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        nn.Dropout(1.5)
    with use_policy("16-mixed"):
        assert nn.Dropout(0.5)(ag.cast(x, "fp16")).fmt.name == "fp16"


# --- batch norm ----------------------------------------------------------------------------

def _data(seed, shape, shift=0.0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + shift).astype(np.float32)
    w, b = (rng.standard_normal(c).astype(np.float32) for _ in range(2))
    return x, w, b, rng.standard_normal(shape).astype(np.float32)


def _rows(a):
    return np.moveaxis(np.asarray(a, np.float64), 1, 0).reshape(a.shape[1], -1)


def _ours(x, w, b, g, rm=None, rv=None, training=True):
    tensors = [Tensor(v, requires_grad=True) for v in (x, w, b)]
    stats = [Tensor(v) for v in (rm, rv)] if rm is not None else [None, None]
    y = ag.batch_norm(tensors[0], *stats, tensors[1], tensors[2], training=training, eps=EPS)
    y.backward(Tensor(g))
    return [_np(y)] + [_np(t.grad) for t in tensors], stats


def test_batch_norm_is_the_exact_value_rounded_once():
    gmpy2 = pytest.importorskip("gmpy2")
    from mpfr_oracle import mpfr_rounded

    x, w, b, g = _data(1, (3, 4, 3, 2), shift=50.0)
    ours, _ = _ours(x, w, b, g)
    ys, dxs, dws, dbs = [], [], [], []
    with gmpy2.context(precision=300):
        for c, (xr, gr) in enumerate(zip(_rows(x).tolist(), _rows(g).tolist())):
            xr, gr = [gmpy2.mpfr(v) for v in xr], [gmpy2.mpfr(v) for v in gr]
            n = len(xr)
            m = gmpy2.fsum(xr) / n
            r = 1 / gmpy2.sqrt(gmpy2.fsum([(v - m) ** 2 for v in xr]) / n + gmpy2.mpfr(EPS))
            x_hat = [(v - m) * r for v in xr]
            wc, bc = gmpy2.mpfr(float(w[c])), gmpy2.mpfr(float(b[c]))
            ys.append([h * wc + bc for h in x_hat])
            gw = [v * wc for v in gr]
            mean_gw = gmpy2.fsum(gw) / n
            mean_gwx = gmpy2.fsum([a * h for a, h in zip(gw, x_hat)]) / n
            dxs.append([r * (a - mean_gw - h * mean_gwx) for a, h in zip(gw, x_hat)])
            dws.append(gmpy2.fsum([v * h for v, h in zip(gr, x_hat)]))
            dbs.append(gmpy2.fsum(gr))

    def back(rows):   # (C, N*H*W) -> (N, C, H, W)
        flat = mpfr_rounded([v for row in rows for v in row], "fp32")
        return np.moveaxis(flat.reshape((x.shape[1], x.shape[0]) + x.shape[2:]), 0, 1)

    for mine, expected in zip(ours, (back(ys), back(dxs), mpfr_rounded(dws, "fp32"),
                                     mpfr_rounded(dbs, "fp32"))):
        np.testing.assert_array_equal(_bits(mine), _bits(expected))


def _torch_backward(x, dy, w, m, r):
    """Running error bounds of PyTorch's batch-norm gradients and its formulas' values from
    its own m, r (float64 arrays (C, M), (C, 1)); returns ((dx, e_dx), (dw, e_dw), (db, e_db))."""
    n = x.shape[1]
    xm = x - m
    s, d = dy.sum(1, keepdims=True), (xm * dy).sum(1, keepdims=True)
    e_s = gamma(n) * np.abs(dy).sum(1, keepdims=True)
    e_d = gamma(n + 2) * (np.abs(xm) * np.abs(dy)).sum(1, keepdims=True)
    k = d * r * r / n
    e_k = (e_d + gamma(3) * np.abs(d)) * r * r / n
    gm = s / n
    e_gm = (e_s + U * np.abs(s)) / n
    t = xm * k
    e_t = np.abs(xm) * e_k + gamma(2) * np.abs(t)
    q = dy - gm - t
    e_q = e_gm + e_t + gamma(2) * (np.abs(dy) + np.abs(gm) + np.abs(t))
    dx = q * r * w
    e_dx = e_q * r * np.abs(w) + gamma(2) * np.abs(dx)
    return (dx, e_dx), (d * r, e_d * r + U * np.abs(d) * r), (s, e_s)


def test_batch_norm_matches_torch_fp32_within_the_derived_bound():
    torch = pytest.importorskip("torch")
    x, w, b, g = _data(2, (6, 3, 5, 4), shift=3.0)
    rm0, rv0 = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.5, 0.25, 4.0], np.float32)
    momentum = 0.1
    (y, dx, dw, db), (rm, rv) = _ours(x, w, b, g, rm0, rv0)
    ts = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    trm, trv = torch.tensor(rm0), torch.tensor(rv0)
    ty = torch.nn.functional.batch_norm(ts[0], trm, trv, ts[1], ts[2], True, momentum, EPS)
    ty.backward(torch.tensor(g))
    _, tm, tr = torch.native_batch_norm(torch.tensor(x), ts[1].detach(), ts[2].detach(), None,
                                        None, True, momentum, EPS)
    x64, g64 = _rows(x), _rows(g)
    m, r = tm.double().numpy()[:, None], tr.double().numpy()[:, None]
    w64, b64 = w.astype(np.float64)[:, None], b.astype(np.float64)[:, None]
    n = x64.shape[1]
    true_m = x64.mean(1, keepdims=True)
    true_r = 1 / np.sqrt(((x64 - true_m) ** 2).mean(1, keepdims=True) + EPS)
    x_hat = (x64 - true_m) * true_r
    # forward
    exact = x_hat * w64 + b64
    terms = (np.abs(x64) + np.abs(m)) * r * np.abs(w64) + np.abs(b64)
    bound = (gamma(4) * terms * SECOND_ORDER + np.abs((x64 - m) * r * w64 + b64 - exact)
             + U * np.abs(exact) + SLACK * terms)
    assert np.all(np.abs(_rows(y) - _rows(ty.detach().numpy())) <= bound)
    # backward
    gw = g64 * w64
    exact_dx = true_r * (gw - gw.mean(1, keepdims=True)
                         - x_hat * (gw * x_hat).mean(1, keepdims=True))
    (f_dx, e_dx), (f_dw, e_dw), (f_db, e_db) = _torch_backward(x64, g64, w64, m, r)
    magnitude = true_r * np.abs(gw).sum(1, keepdims=True) * (1 + np.abs(true_m) * true_r)
    bound = (e_dx * SECOND_ORDER + np.abs(f_dx - exact_dx) + U * np.abs(exact_dx)
             + SLACK * magnitude)
    assert np.all(np.abs(_rows(dx) - _rows(ts[0].grad.numpy())) <= bound)
    exact_dw = (g64 * x_hat).sum(1, keepdims=True)
    bound = (e_dw * SECOND_ORDER + np.abs(f_dw - exact_dw) + U * np.abs(exact_dw)
             + SLACK * (np.abs(g64) * (np.abs(x64) + np.abs(m)) * r).sum(1, keepdims=True))
    assert np.all(np.abs(dw[:, None] - ts[1].grad.double().numpy()[:, None]) <= bound)
    bound = e_db * SECOND_ORDER + U * np.abs(f_db)
    assert np.all(np.abs(db[:, None] - ts[2].grad.double().numpy()[:, None]) <= bound)
    # running statistics
    mom = float(np.float32(momentum))
    old_m, old_v = rm0.astype(np.float64)[:, None], rv0.astype(np.float64)[:, None]
    s2 = ((x64 - true_m) ** 2).sum(1, keepdims=True)
    exact_rm = (1 - momentum) * old_m + momentum * true_m
    exact_rv = (1 - momentum) * old_v + momentum * s2 / (n - 1)
    e_var_sum = gamma(n + 2) * s2 + n * (np.abs(m - true_m) + U * np.abs(true_m)) ** 2
    torch_rm = mom * m + (1 - mom) * old_m
    bound = (gamma(3) * (mom * np.abs(m) + (1 - mom) * np.abs(old_m)) * SECOND_ORDER
             + np.abs(torch_rm - exact_rm) + U * np.abs(exact_rm) + SLACK)
    assert np.all(np.abs(_np(rm)[:, None] - trm.double().numpy()[:, None]) <= bound)
    torch_rv = mom * s2 / (n - 1) + (1 - mom) * old_v
    bound = ((gamma(3) * (mom * s2 / (n - 1) + (1 - mom) * old_v) + mom * e_var_sum / (n - 1))
             * SECOND_ORDER + np.abs(torch_rv - exact_rv) + U * np.abs(exact_rv) + SLACK)
    assert np.all(np.abs(_np(rv)[:, None] - trv.double().numpy()[:, None]) <= bound)


def test_batch_norm_eval_uses_running_statistics():
    torch = pytest.importorskip("torch")
    x, w, b, g = _data(3, (4, 3, 3, 3))
    rm, rv = np.array([0.1, -0.4, 2.0], np.float32), np.array([0.8, 1.7, 3.0], np.float32)
    (y, dx, dw, db), stats = _ours(x, w, b, g, rm, rv, training=False)
    np.testing.assert_array_equal(_np(stats[0]), rm)            # eval leaves them alone
    x64 = _rows(x)
    r = 1 / np.sqrt(rv.astype(np.float64)[:, None] + EPS)
    x_hat = (x64 - rm[:, None]) * r
    exact = x_hat * w[:, None] + b[:, None]
    np.testing.assert_array_equal(_rows(y), exact.astype(np.float32))
    ts = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    ty = torch.nn.functional.batch_norm(ts[0], torch.tensor(rm), torch.tensor(rv), ts[1],
                                        ts[2], False, 0.1, EPS)
    ty.backward(torch.tensor(g))
    # PyTorch: r' = 1 / sqrt(var + eps) in fp32 (2 roundings + sqrt: gamma_3 relative), then
    # the forward's 4 roundings
    terms = (np.abs(x64) + np.abs(rm[:, None])) * r * np.abs(w[:, None]) + np.abs(b[:, None])
    bound = (gamma(4) + gamma(3)) * terms * SECOND_ORDER + U * np.abs(exact) + SLACK * terms
    assert np.all(np.abs(_rows(y) - _rows(ty.detach().numpy())) <= bound)
    exact_dx = _rows(g) * w[:, None] * r
    bound = (gamma(5) * SECOND_ORDER + U) * np.abs(exact_dx) + SLACK * np.abs(exact_dx)
    assert np.all(np.abs(_rows(dx) - _rows(ts[0].grad.numpy())) <= bound)


def test_batch_norm_formats_under_16_mixed():
    """Autocast's lists have no batch_norm: an fp16 conv output gives an fp16 batch-norm
    output (fp32 weight and statistics, exact inside); the statistics stay fp32."""
    x, w, b, g = _data(4, (2, 3, 4, 4))
    with use_policy("16-mixed"):
        conv = nn.Conv2d(3, 3, 1, rng=0)
        bn = nn.BatchNorm2d(3)
        h = conv(Tensor(x))
        y = bn(h)
    assert (h.fmt.name, y.fmt.name, bn.running_mean.fmt.name) == ("fp16", "fp16", "fp32")
    with use_policy("64-true"):               # the float64 evaluation, not rounded
        exact = ag.batch_norm(Tensor(_np(h).astype(np.float64)), None, None,
                              Tensor(np.ones(3)), Tensor(np.zeros(3)), training=True)
    np.testing.assert_array_equal(_np(y), round_to(_np(exact), "fp16"))


def test_batch_norm_module_buffers_state_dict_and_modes():
    bn = nn.BatchNorm2d(2, momentum=0.5)
    assert [k for k, _ in bn.named_parameters()] == ["weight", "bias"]
    assert [k for k, _ in bn.named_buffers()] == ["running_mean", "running_var",
                                                  "num_batches_tracked"]
    model = nn.Sequential(nn.Conv2d(1, 2, 3, rng=0), bn)
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias",
                                        "1.running_mean", "1.running_var",
                                        "1.num_batches_tracked"]
    x = Tensor(np.random.default_rng(5).standard_normal((4, 1, 5, 5)))
    model(x)
    state = model.state_dict()
    assert not np.all(state["1.running_mean"] == 0)
    other = nn.Sequential(nn.Conv2d(1, 2, 3, rng=1), nn.BatchNorm2d(2, momentum=0.5))
    other.load_state_dict(state)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, state[k])
    model.eval()
    before = model.state_dict()["1.running_var"]
    y1, y2 = _np(model(x)), _np(model(x))
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(model.state_dict()["1.running_var"], before)
    assert model.state_dict()["1.num_batches_tracked"] == 1       # training passes only
    free = nn.BatchNorm2d(2, affine=False, track_running_stats=False)
    assert free.parameters() == [] and list(free.state_dict()) == []
    with pytest.raises(ValueError, match="more than 1 value"):
        nn.BatchNorm2d(2)(Tensor(np.ones((1, 2, 1, 1))))
    with pytest.raises(ValueError, match="N, C, H, W"):
        nn.BatchNorm2d(2)(Tensor(np.ones((2, 2))))
    with pytest.raises(ValueError, match="momentum=None"):
        nn.BatchNorm2d(2, momentum=None)


def test_running_statistics_round_trip_through_a_checkpoint(tmp_path):
    """The checkpoint code saves ``model.state_dict()``; the buffers ride along, bit for bit."""
    from fpsim.train.checkpoint import load_checkpoint, save_checkpoint

    model = nn.Sequential(nn.Conv2d(2, 3, 3, rng=0), nn.BatchNorm2d(3), nn.ReLU())
    model(Tensor(np.random.default_rng(7).standard_normal((4, 2, 6, 6))))
    path = tmp_path / "model.npz"
    save_checkpoint(path, model.state_dict(), {"step": 1})
    arrays, meta = load_checkpoint(path)
    fresh = nn.Sequential(nn.Conv2d(2, 3, 3, rng=1), nn.BatchNorm2d(3), nn.ReLU())
    fresh.load_state_dict(arrays)
    for name, value in model.state_dict().items():      # bit for bit, the float64 count too
        assert fresh.state_dict()[name].dtype == value.dtype
        assert fresh.state_dict()[name].tobytes() == value.tobytes()
    model.eval()
    fresh.eval()
    x = Tensor(np.ones((1, 2, 6, 6)))
    np.testing.assert_array_equal(_np(model(x)), _np(fresh(x)))
