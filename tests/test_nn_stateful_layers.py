"""The common layers of issue 43 with parameters or state layout of their own: GroupNorm,
Embedding's padding_idx, the stacked LSTM and BatchNorm2d's num_batches_tracked, each
against PyTorch (float64 and fp32; fp16 where CPU torch has it), loading torch's state dict
and converted by ``from_torch``. Their finite-difference gradient checks are cases of
``test_autograd_gradcheck.py`` (group_norm) or here (Embedding's padding row).
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import nn
from fpsim.autograd import Tensor, use_policy

from layer_oracles import (U, as_array, run_ours, run_torch,
                           same_function_float64, sparse_exponents)

torch = pytest.importorskip("torch")


# --- GroupNorm ------------------------------------------------------------------------------

def _group_norm_case(seed, shape=(3, 6, 4, 5), groups=3):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float16).astype(np.float32)
    theirs = torch.nn.GroupNorm(groups, shape[1])
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(rng.standard_normal(shape[1]).astype(np.float32)))
        theirs.bias.copy_(torch.tensor(rng.standard_normal(shape[1]).astype(np.float32)))
    gy = rng.standard_normal(shape).astype(np.float32)
    return x, gy, theirs


def _torch_group_norm_grads(theirs, x, gy, dtype):
    layer = theirs.to(dtype)
    layer.zero_grad()
    t_y, t_dx = run_torch(layer, x, gy, dtype)
    grads = [p.grad.double().numpy() for p in (layer.weight, layer.bias)]
    theirs.float()
    return t_y, t_dx, grads


def test_group_norm_is_the_float64_value_rounded_once_and_near_torch_fp32():
    """Ours: the float64 group norm rounded once (within u |y| of torch's float64 result,
    plus float64 noise), gradients likewise. Torch's fp32 kernel, from its own moments m'
    and r' (``native_group_norm``): within gamma_4 ((|x| + |m'|) r' |w| + |b|) plus
    |y(m', r') - y(m, r)| |w| of ours, plus our u |y|."""
    x, gy, theirs = _group_norm_case(15)
    with use_policy("32-true"):
        ours = nn.from_torch(theirs)
    assert isinstance(ours, nn.GroupNorm) and (ours.num_groups, ours.num_channels) == (3, 6)
    y, dx, fmt = run_ours(ours, x, gy, "32-true")
    assert fmt == "fp32"
    ref_y, ref_dx, ref_grads = _torch_group_norm_grads(theirs, x, gy, torch.float64)
    tiny = 1e-12 * np.abs(ref_y).max()
    assert np.all(np.abs(y - ref_y) <= U * np.abs(ref_y) + tiny)
    assert np.all(np.abs(dx - ref_dx) <= U * np.abs(ref_dx) + 1e-12 * np.abs(ref_dx).max())
    for p, ref in zip((ours.weight, ours.bias), ref_grads):
        assert np.all(np.abs(as_array(p.grad) - ref) <= U * np.abs(ref) + 1e-12 * np.abs(ref).max())

    t_y, _, _ = _torch_group_norm_grads(theirs, x, gy, torch.float32)
    n, c = x.shape[:2]
    _, tm, tr = torch.native_group_norm(torch.tensor(x), None, None, n, c, x[0, 0].size, 3,
                                        1e-5)
    per_channel = np.repeat(np.arange(3), c // 3)
    tm = tm.double().numpy()[:, per_channel, None, None]
    tr = tr.double().numpy()[:, per_channel, None, None]
    w = theirs.weight.detach().double().numpy()[None, :, None, None]
    b = theirs.bias.detach().double().numpy()[None, :, None, None]
    x64 = x.astype(np.float64)
    rows = x64.reshape(n, 3, -1)
    m = np.repeat(rows.mean(-1), c // 3, axis=1)[:, :, None, None]
    r = np.repeat(1 / np.sqrt(rows.var(-1) + 1e-5), c // 3, axis=1)[:, :, None, None]
    bound = (4 * U / (1 - 4 * U) * ((np.abs(x64) + np.abs(tm)) * tr * np.abs(w) + np.abs(b))
             + np.abs((x64 - tm) * tr - (x64 - m) * r) * np.abs(w) + U * np.abs(ref_y))
    assert np.all(np.abs(y - t_y) <= bound)


def test_group_norm_formats_follow_autocast():
    """On autocast's float32 list (``wide``): under "16-mixed" an fp16 input gives the fp32
    output "32-true" gives on the same values; under "16-true" fp16 out, within one fp16
    ulp of torch's half kernel (its float value rounded to fp16)."""
    x, gy, theirs = _group_norm_case(16)
    with use_policy("32-true"):
        ours = nn.from_torch(theirs)
    wide, _, fmt32 = run_ours(ours, x, gy, "32-true")
    mixed, _, fmt_mixed = run_ours(ours, x, gy, "16-mixed", "fp16")
    assert (fmt32, fmt_mixed) == ("fp32", "fp32")
    np.testing.assert_array_equal(mixed, wide)
    with use_policy("16-true"):
        ours16 = nn.from_torch(theirs)
        y16 = ours16(Tensor(x, "fp16"))
    assert y16.fmt.name == "fp16"
    t16 = theirs.half()(torch.tensor(x).half()).detach().float().numpy()
    theirs.float()
    spacing = np.spacing(np.abs(t16).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(as_array(y16) - t16) <= spacing)


def test_group_norm_refusals_and_conversion():
    with pytest.raises(ValueError, match="num_groups=4 must divide num_channels=6"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match="eps must be a number > 0"):
        nn.GroupNorm(2, 6, eps=0.0)
    with pytest.raises(TypeError, match="affine must be True or False"):
        nn.GroupNorm(2, 6, affine=1)
    with pytest.raises(ValueError, match=r"GroupNorm expects input \(N, 6, \.\.\.\)"):
        nn.GroupNorm(2, 6)(Tensor(np.ones((2, 4, 3))))
    assert nn.GroupNorm(2, 6, affine=False).state_dict() == {}
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.GroupNorm(2, 4),
                                torch.nn.ReLU(), torch.nn.GroupNorm(4, 4, affine=False))
    with torch.no_grad():
        model[1].weight.normal_()
        model[1].bias.normal_()
    x = np.random.default_rng(5).standard_normal((2, 2, 5, 4))
    ours = same_function_float64(model, nn.from_torch, x)
    assert ours[3].weight is None


# --- Embedding padding_idx ------------------------------------------------------------------

def test_embedding_padding_row_is_zeroed_at_init_and_gets_no_gradient():
    plain, padded = nn.Embedding(6, 3, rng=4), nn.Embedding(6, 3, padding_idx=-2, rng=4)
    assert padded.padding_idx == 4
    w_plain, w_padded = as_array(plain.weight), as_array(padded.weight)
    assert np.all(w_padded[4] == 0) and not np.signbit(w_padded[4]).any()
    np.testing.assert_array_equal(np.delete(w_padded, 4, 0), np.delete(w_plain, 4, 0))
    with pytest.raises(ValueError, match=r"padding_idx must lie in \[-6, 6\)"):
        nn.Embedding(6, 3, padding_idx=6)
    with pytest.raises(TypeError, match="padding_idx must be an integer row index or None"):
        nn.Embedding(6, 3, padding_idx=1.0)


@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "16-true"])
def test_embedding_padding_idx_equals_torch(policy):
    """Lookups are exact, the padding row's gradient is zero, the other rows' gradients the
    exact sums of their positions' gradients (torch's index_add, exact on these values)."""
    rng = np.random.default_rng(17)
    theirs = torch.nn.Embedding(7, 3, padding_idx=2)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(sparse_exponents(rng, (7, 3))))
        theirs.weight[2] = 0.5          # a trained-away padding row is looked up as stored
    idx = np.array([[2, 0, 2, 5], [1, 2, 5, 5]])
    gy = sparse_exponents(rng, (2, 4, 3))
    t_out = theirs(torch.tensor(idx))
    t_out.backward(torch.tensor(gy))
    with use_policy(policy):
        ours = nn.from_torch(theirs)
        out = ours(idx)
        out.backward(Tensor(gy, out.fmt))
    assert ours.padding_idx == 2
    np.testing.assert_array_equal(as_array(out), t_out.detach().numpy())
    grad = as_array(ours.weight.grad)
    np.testing.assert_array_equal(grad, theirs.weight.grad.numpy())
    assert np.all(grad[2] == 0)


def test_embedding_padding_idx_gradient_check():
    """Central differences in float64 for every row but the padding row, whose gradient is
    zero by definition (torch's), though the output reads it."""
    rng = np.random.default_rng(18)
    weights = rng.standard_normal((5, 2))
    idx = np.array([0, 3, 3, 1, 4, 3])
    gy = rng.uniform(0.5, 1.5, (6, 2))

    def value(w):
        layer = nn.Embedding(5, 2, padding_idx=3)
        layer.weight = Tensor(w, requires_grad=True)
        return layer, layer(idx)

    with use_policy("64-true"):
        layer, out = value(weights)
        (out * Tensor(gy)).sum().backward()
        analytic = as_array(layer.weight.grad)
        numeric = np.zeros_like(weights)
        with ag.no_grad():
            for i, j in np.ndindex(*weights.shape):
                step = np.zeros_like(weights)
                step[i, j] = 1e-6
                plus = float(np.sum(as_array(value(weights + step)[1]) * gy))
                minus = float(np.sum(as_array(value(weights - step)[1]) * gy))
                numeric[i, j] = (plus - minus) / 2e-6
    np.testing.assert_allclose(np.delete(analytic, 3, 0), np.delete(numeric, 3, 0),
                               rtol=1e-7, atol=1e-8)
    assert np.all(analytic[3] == 0) and np.all(numeric[3] != 0)


# --- LSTM with several layers ---------------------------------------------------------------

def _torch_lstm(layers, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return torch.nn.LSTM(3, 4, num_layers=layers, dropout=dropout, batch_first=True)


def _chained_single_layers(ours, x, policy, between=None):
    """The stacked LSTM written by hand: one-layer LSTMs with its weights, in sequence."""
    state = ours.state_dict()
    finals = []
    with use_policy(policy):
        outputs = Tensor(x)
        for layer in range(ours.num_layers):
            single = nn.LSTM(3 if layer == 0 else 4, 4)
            single.load_state_dict({name: state[f"{name}_l{layer}"] for name in
                                    ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
            if layer > 0 and between is not None:
                outputs = between(outputs)
            outputs, final = single(outputs)
            finals.append(final)
    return outputs, finals


@pytest.mark.parametrize("policy", ["64-true", "32-true", "16-mixed", "16-true"])
def test_stacked_lstm_is_its_layers_in_sequence(policy):
    """Bit for bit, under each policy: layer k reads layer k - 1's outputs; h_T and c_T are
    the layers' final states stacked (num_layers, B, H), as torch's."""
    x = np.random.default_rng(19).standard_normal((2, 5, 3))
    with use_policy(policy):
        ours = nn.from_torch(_torch_lstm(3))
        out, (h, c) = ours(Tensor(x))
    expected, finals = _chained_single_layers(ours, x, policy)
    assert h.shape == c.shape == (3, 2, 4) and out.fmt.name == expected.fmt.name
    np.testing.assert_array_equal(as_array(out), as_array(expected))
    for layer, (h_k, c_k) in enumerate(finals):
        np.testing.assert_array_equal(as_array(h)[layer], as_array(h_k))
        np.testing.assert_array_equal(as_array(c)[layer], as_array(c_k))


def test_stacked_lstm_forward_equals_torch():
    """float64: torch's function (1e-12); fp32: torch's CPU LSTM within 64 u of the values
    (5 steps of a few correctly rounded or once-rounded ops each, ours and torch's)."""
    theirs = _torch_lstm(2)
    x = np.random.default_rng(20).standard_normal((2, 5, 3))
    state = [np.random.default_rng(21).standard_normal((2, 2, 4)) * 0.5 for _ in range(2)]
    t_out, (t_h, t_c) = theirs(torch.tensor(x, dtype=torch.float32),
                               tuple(torch.tensor(s, dtype=torch.float32) for s in state))
    with use_policy("32-true"):
        ours = nn.from_torch(theirs)
        out, (h, c) = ours(Tensor(x), tuple(Tensor(s) for s in state))
    for mine, ref in ((out, t_out), (h, t_h), (c, t_c)):
        ref = ref.detach().numpy()
        assert np.all(np.abs(as_array(mine) - ref) <= 64 * U * np.maximum(np.abs(ref), 1))
    theirs = theirs.double()
    t_out, (t_h, t_c) = theirs(torch.tensor(x), tuple(torch.tensor(s) for s in state))
    with use_policy("64-true"):
        ours = nn.from_torch(theirs)
        out, (h, c) = ours(Tensor(x), tuple(Tensor(s) for s in state))
    for mine, ref in ((out, t_out), (h, t_h), (c, t_c)):
        np.testing.assert_allclose(as_array(mine), ref.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_stacked_lstm_gradients_equal_torch_float64():
    theirs = _torch_lstm(2).double()
    x = np.random.default_rng(22).standard_normal((2, 5, 3))
    with use_policy("64-true"):
        ours = nn.from_torch(theirs)
        out, _ = ours(Tensor(x))
        out.sum().backward()
    theirs(torch.tensor(x))[0].sum().backward()
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(as_array(mine[name].grad), p.grad.numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)


def test_stacked_lstm_names_init_and_state_dict_are_torchs():
    ours = nn.LSTM(3, 4, num_layers=2, rng=0)
    names = [f"{kind}_l{layer}" for layer in (0, 1)
             for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    assert list(ours.state_dict()) == names
    assert ours.weight_ih_l1.shape == (16, 4)
    assert np.all(np.abs(as_array(ours.weight_hh_l1)) <= 0.5)         # U(+-1/sqrt(H))
    theirs = _torch_lstm(2)
    twin = nn.LSTM(3, 4, num_layers=2)
    twin.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})   # strict
    assert list(nn.LSTM(3, 4, rng=0).state_dict()) == ["weight_ih", "weight_hh", "bias_ih",
                                                      "bias_hh"]       # one layer: as before


def test_stacked_lstm_dropout_between_layers():
    """Training mode: layer 0's outputs pass Dropout(p, seed) before layer 1 (fpsim's Philox
    masks; PyTorch's share only their distribution); eval mode: no dropout, torch's
    function."""
    theirs = _torch_lstm(2, dropout=0.3).double()
    x = np.random.default_rng(23).standard_normal((2, 5, 3))
    with use_policy("64-true"):
        ours = nn.from_torch(theirs)
        assert ours.dropout == 0.3 and ours.between.p == 0.3
        trained, _ = ours(Tensor(x))
        expected, _ = _chained_single_layers(ours, x, "64-true",
                                             nn.Dropout(0.3, seed=ours.between.seed))
        np.testing.assert_array_equal(as_array(trained), as_array(expected))
        assert ours.between.offset == 2 * 5 * 4
        ours.eval()
        evaluated, _ = ours(Tensor(x))
    theirs.eval()
    np.testing.assert_allclose(as_array(evaluated), theirs(torch.tensor(x))[0].detach().numpy(),
                               rtol=1e-12, atol=1e-14)
    assert not np.array_equal(as_array(trained), as_array(evaluated))


def test_stacked_lstm_refusals():
    with pytest.raises(ValueError, match="num_layers must be a positive integer, got 0"):
        nn.LSTM(3, 4, num_layers=0)
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\], got 1.5"):
        nn.LSTM(3, 4, num_layers=2, dropout=1.5)
    with pytest.raises(ValueError, match=r"LSTM h0 must be \(2, 2, 4\), got \(2, 4\)"):
        nn.LSTM(3, 4, num_layers=2)(Tensor(np.ones((2, 5, 3))),
                                    (Tensor(np.ones((2, 4))), Tensor(np.ones((2, 4)))))
    with pytest.raises(TypeError, match="seed must be an integer >= 0, got 'a'"):
        nn.LSTM(3, 4, seed="a")
    with pytest.raises(ValueError, match="only batch_first=True, unidirectional"):
        nn.from_torch(torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True))


# --- BatchNorm2d's num_batches_tracked ------------------------------------------------------

def test_batch_norm_twin_loads_torchs_state_dict_strictly_and_counts_as_torch():
    """torch's state dict (num_batches_tracked included) loads into a hand-written twin
    without strict=False; training passes count up as torch's, eval passes do not; the
    count round-trips through from_torch and state_dict, exactly."""
    torch.manual_seed(6)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    x = np.random.default_rng(24).standard_normal((4, 1, 6, 6)).astype(np.float32)
    for _ in range(3):
        theirs(torch.tensor(x))
    twin = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    twin.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    converted = nn.from_torch(theirs)
    for ours in (twin, converted):
        assert float(ours.state_dict()["1.num_batches_tracked"]) == 3.0
        ours(Tensor(x))
        ours.eval()
        ours(Tensor(x))
    theirs(torch.tensor(x))
    theirs.eval()
    theirs(torch.tensor(x))
    assert int(theirs[1].num_batches_tracked) == 4
    for ours in (twin, converted):
        assert float(ours.state_dict()["1.num_batches_tracked"]) == 4.0
        np.testing.assert_array_equal(ours.state_dict()["1.running_mean"],
                                      theirs[1].running_mean.numpy())
    big = nn.BatchNorm2d(2)
    big.load_state_dict({**big.state_dict(), "num_batches_tracked": np.int64(2 ** 40 + 1)})
    assert big.state_dict()["num_batches_tracked"] == 2 ** 40 + 1        # exact in float64


@pytest.mark.parametrize("policy", ["16-true", "bf16-true"])
def test_batch_norm_count_stays_exact_under_low_precision_policies(policy):
    """The count is float64 whatever the parameter format: 2049 batches in fp16 would
    round to 2048."""
    with use_policy(policy):
        bn = nn.BatchNorm2d(2)
    bn.load_state_dict({**bn.state_dict(), "num_batches_tracked": np.int64(2048)})
    with use_policy(policy):
        bn(Tensor(np.random.default_rng(25).standard_normal((2, 2, 3, 3))))
    assert bn.state_dict()["num_batches_tracked"] == 2049


def test_batch_norm_refuses_a_count_that_is_not_one():
    bn = nn.BatchNorm2d(2)
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match=r"'num_batches_tracked': num_batches_tracked "
                                             r"counts batches and must be a whole number"):
            bn.load_state_dict({**bn.state_dict(), "num_batches_tracked": np.float64(bad)})
    assert bn.state_dict()["num_batches_tracked"] == 0
    assert "num_batches_tracked" not in nn.BatchNorm2d(2, track_running_stats=False).state_dict()
