"""nn.MultiheadAttention, causal_mask and nn.TransformerBlock.

Against PyTorch's ``nn.MultiheadAttention`` (batch first, need_weights=True: its explicit
path, q * sqrt(1/D), baddbmm with the -inf mask, softmax, bmm, out_proj) in fp32 on CPU,
within the first-order bound of ``error_bounds`` (derived there, layer by layer); with D = 4
the scale 1/2 is exact in both. Gradients: the float64 reference mode ("64-true") against
PyTorch in float64, the same calculus to float64 accuracy.
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

import error_bounds as eb


def _np(t):
    return backend.to_numpy(t.data)


def _torch_mha(torch, ours, dtype):
    t = torch.nn.MultiheadAttention(ours.embed_dim, ours.num_heads, batch_first=True).to(dtype)
    with torch.no_grad():
        for name, p in t.named_parameters():
            p.copy_(torch.tensor(ours.state_dict()[name]))
    return t


def _masks(batch, length):
    kpm = np.zeros((batch, length), bool)
    kpm[1, -2:] = True
    return backend.to_numpy(nn.causal_mask(length)), kpm


def _bound(ours, x, causal, kpm):
    """The error bound of attention output and (head-averaged) weights (error_bounds)."""
    e, h = ours.embed_dim, ours.num_heads
    d = e // h
    sd = ours.state_dict()
    x = eb.Bound(x)
    proj = eb.linear(x, sd["in_proj_weight"], sd["in_proj_bias"])
    b, n = x.value.shape[:2]

    def heads(part):
        return proj.map(lambda a: a[..., part * e:(part + 1) * e]
                        .reshape(b, n, h, d).transpose(0, 2, 1, 3))

    q, k, v = heads(0), heads(1), heads(2)
    scores = eb.matmul(eb.scale(q, d ** -0.5), k.map(lambda a: a.transpose(0, 1, 3, 2)))
    drop = causal[None, None] | kpm[:, None, None, :]
    p = eb.softmax(eb.masked(scores, drop))
    o = eb.matmul(p, v).map(lambda a: a.transpose(0, 2, 1, 3).reshape(b, n, e))
    out = eb.linear(o, sd["out_proj.weight"], sd["out_proj.bias"])
    mean = eb.Bound(p.value.mean(1), p.err.mean(1) + 2 * eb.gamma(h + 1) * p.value.mean(1))
    return out, mean


def test_attention_matches_torch_fp32_within_the_derived_bound():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ours = nn.MultiheadAttention(16, 4, rng=1)
    with ag.no_grad():      # a non-zero bias, to exercise it
        ours.in_proj_bias.data = Tensor(rng.standard_normal(48) * 0.1).data
        ours.out_proj.bias.data = Tensor(rng.standard_normal(16) * 0.1).data
    theirs = _torch_mha(torch, ours, torch.float32)
    x = rng.standard_normal((2, 7, 16)).astype(np.float32)
    causal, kpm = _masks(2, 7)
    out, weights = ours(Tensor(x), attn_mask=causal, key_padding_mask=kpm)
    tx = torch.tensor(x)
    t_out, t_weights = theirs(tx, tx, tx, attn_mask=torch.tensor(causal),
                              key_padding_mask=torch.tensor(kpm))
    b_out, b_weights = _bound(ours, x.astype(np.float64), causal, kpm)
    assert b_out.holds(_np(out), t_out.detach().numpy()) <= 1
    assert b_weights.holds(_np(weights), t_weights.detach().numpy()) <= 1
    assert np.all(_np(weights)[1, :, -2:] == 0)            # padded keys get no weight


def test_attention_gradients_equal_torch_in_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    with use_policy("64-true"):
        ours = nn.MultiheadAttention(12, 3, rng=2)
        x = rng.standard_normal((2, 5, 12))
        g = rng.standard_normal((2, 5, 12))
        causal, kpm = _masks(2, 5)
        xt = Tensor(x, requires_grad=True)
        out, _ = ours(xt, attn_mask=causal, key_padding_mask=kpm)
        out.backward(Tensor(g))
    theirs = _torch_mha(torch, ours, torch.float64)
    tx = torch.tensor(x, requires_grad=True)
    t_out, _ = theirs(tx, tx, tx, attn_mask=torch.tensor(causal),
                      key_padding_mask=torch.tensor(kpm))
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(_np(out), t_out.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(_np(xt.grad), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    ours_grads = {k: _np(p.grad) for k, p in ours.named_parameters()}
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(ours_grads[name], p.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_attention_formats_under_16_mixed_and_masks():
    rng = np.random.default_rng(3)
    attn = nn.MultiheadAttention(8, 2, rng=0)
    x = Tensor(rng.standard_normal((2, 4, 8)))
    with use_policy("16-mixed"):
        out, weights = attn(x, attn_mask=nn.causal_mask(4))
        per_head, _ = attn(x, need_weights=True, average_attn_weights=False)
    assert (out.fmt.name, weights.fmt.name) == ("fp16", "fp32")   # softmax: autocast fp32
    assert per_head.shape == (2, 4, 8)
    _, all_heads = attn(x, average_attn_weights=False)
    assert all_heads.shape == (2, 2, 4, 4)
    # an additive float mask of 0 / -inf is the boolean mask
    causal = backend.to_numpy(nn.causal_mask(4))
    additive = np.where(causal, -np.inf, 0.0)
    a, _ = attn(x, attn_mask=causal)
    b, _ = attn(x, attn_mask=additive)
    np.testing.assert_array_equal(_np(a), _np(b))
    # a (B * heads, L, S) mask, one per batch element and head
    per = np.broadcast_to(causal, (4, 4, 4))
    c, _ = attn(x, attn_mask=per)
    np.testing.assert_array_equal(_np(a), _np(c))
    # cross-attention: query and key/value of different lengths
    memory = Tensor(rng.standard_normal((2, 6, 8)))
    cross, w = attn(x, memory, memory)
    assert cross.shape == (2, 4, 8) and w.shape == (2, 4, 6)
    # a fully masked row is NaN (softmax of all -inf), as PyTorch
    full = np.ones((4, 4), bool)
    nan_out, _ = attn(x, attn_mask=full)
    assert np.all(np.isnan(_np(nan_out)))
    with pytest.raises(ValueError, match="divisible"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="attn_mask has shape"):
        attn(x, attn_mask=np.zeros((3, 3), bool))
    with pytest.raises(TypeError, match="batch_first must be"):
        nn.MultiheadAttention(8, 2, batch_first="no")


def test_sequence_first_attention_and_post_ln_block_are_the_batch_first_ones_transposed():
    """batch_first=False (PyTorch's default) only transposes: the same bits as batch first;
    a post-LN block (norm_first=False) rounds where its own ops do (against torch:
    test_from_torch_traced.py)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 8))
    mask = nn.causal_mask(5)
    with use_policy("16-mixed"):
        first = nn.MultiheadAttention(8, 2, rng=0)
        seq = nn.MultiheadAttention(8, 2, batch_first=False, rng=0)
        a, wa = first(Tensor(x), attn_mask=mask)
        b, wb = seq(Tensor(x.transpose(1, 0, 2)), attn_mask=mask)
        np.testing.assert_array_equal(_np(a), _np(b).transpose(1, 0, 2))
        np.testing.assert_array_equal(_np(wa), _np(wb))
        memory = Tensor(rng.standard_normal((6, 2, 8)))
        assert seq(Tensor(x.transpose(1, 0, 2)), memory, memory)[0].shape == (5, 2, 8)
        post = nn.TransformerBlock(8, 2, dropout=0.0, rng=1, norm_first=False)
        post_seq = nn.TransformerBlock(8, 2, dropout=0.0, rng=1, norm_first=False,
                                       batch_first=False)
        y = post(Tensor(x), attn_mask=mask)
        np.testing.assert_array_equal(_np(y), _np(post_seq(Tensor(x.transpose(1, 0, 2)),
                                                           attn_mask=mask)).transpose(1, 0, 2))
        h = post.norm1(Tensor(x) + post.self_attn(Tensor(x), attn_mask=mask,
                                                  need_weights=False)[0])
        expected = post.norm2(h + post.linear2(post.activation(post.linear1(h))))
        np.testing.assert_array_equal(_np(y), _np(expected))
    with pytest.raises(ValueError, match=r"expects \(length, batch, embed_dim\) inputs"):
        seq(Tensor(x[0]))


def test_causal_mask_is_torchs():
    torch = pytest.importorskip("torch")
    ours = backend.to_numpy(nn.causal_mask(5))
    theirs = torch.nn.Transformer.generate_square_subsequent_mask(5).numpy()
    np.testing.assert_array_equal(ours, theirs == -np.inf)


def test_transformer_block_structure_and_training():
    block = nn.TransformerBlock(16, 4, mlp_ratio=2, dropout=0.1, rng=0)
    names = [k for k, _ in block.named_parameters()]
    assert names == ["self_attn.in_proj_weight", "self_attn.in_proj_bias",
                     "self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear1.weight",
                     "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight",
                     "norm1.bias", "norm2.weight", "norm2.bias"]
    x = Tensor(np.random.default_rng(0).standard_normal((2, 5, 16)), requires_grad=True)
    y = block(x, attn_mask=nn.causal_mask(5))
    assert y.shape == (2, 5, 16)
    y.sum().backward()
    assert all(p.grad is not None for p in block.parameters())
    block.eval()
    a, b = block(x), block(x)
    np.testing.assert_array_equal(_np(a), _np(b))           # no dropout in eval mode
    with use_policy("16-mixed"):
        assert block(x).fmt.name == "fp32"                   # residual: fp32 + fp16 -> fp32
