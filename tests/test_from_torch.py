"""fpsim.nn.from_torch: a PyTorch model's fpsim twin, with the same parameter and buffer
names and values bit for bit, and the same forward values under "32-true" within the
layer-by-layer first-order bound of ``error_bounds`` (derived there).

The transformer block runs PyTorch's ``scaled_dot_product_attention`` on its math backend
(forced: the CPU flash kernel's online softmax rounds differently), which scales q and k by
D**-1/4 each; with D = 16 that is 1/2, exact, as fpsim's q * D**-1/2 = q / 4.
"""
from collections import OrderedDict

import numpy as np
import pytest

from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

import error_bounds as eb

torch = pytest.importorskip("torch")


def _np(t):
    return backend.to_numpy(t.data)


def _torch_state(model):
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _same_state(ours, theirs):
    """The same names in the same order; float values bit for bit, BatchNorm's int64 batch
    count as fpsim's exact float64 count."""
    mine, reference = ours.state_dict(), _torch_state(theirs)
    assert list(mine) == list(reference)
    for name, value in reference.items():
        if name.endswith("num_batches_tracked"):
            assert mine[name].dtype == np.float64 and mine[name] == value
            continue
        assert mine[name].dtype == np.float32
        np.testing.assert_array_equal(mine[name].view(np.uint32), value.view(np.uint32))


def _inputs(module, layers):
    """The input each of ``layers`` receives in a forward pass of ``module`` (hooks)."""
    seen = {}

    def keep(key):
        def hook(mod, args, out):
            seen[key] = args[0].detach().numpy()       # returns None: the output stands
        return hook

    handles = [layer.register_forward_hook(keep(key)) for key, layer in layers.items()]
    return seen, handles


def test_cnn_converted_same_weights_same_outputs():
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 6, 3, stride=1, padding=1, groups=2),
        torch.nn.SiLU(), torch.nn.AvgPool2d(2), torch.nn.Flatten(), torch.nn.Dropout(0.2),
        torch.nn.Linear(6 * 3 * 3, 10))
    cnn(torch.randn(8, 1, 12, 12))           # a training step moves the running statistics
    cnn.eval()
    model = nn.from_torch(cnn)
    assert not model.training and not model[1].training
    _same_state(model, cnn)
    x = np.random.default_rng(1).standard_normal((5, 1, 12, 12)).astype(np.float32)
    ours = _np(model(Tensor(x)))
    theirs = cnn(torch.tensor(x)).detach().numpy()

    sd = _torch_state(cnn)
    h = eb.conv2d(eb.Bound(x), sd["0.weight"], sd["0.bias"], 1, 1, 1, 1)
    h = eb.batch_norm_eval(h, sd["1.running_mean"], sd["1.running_var"], sd["1.weight"],
                           sd["1.bias"])
    h = eb.max_pool2d(eb.relu(h), 2, 2, 0)
    h = eb.silu(eb.conv2d(h, sd["4.weight"], sd["4.bias"], 1, 1, 1, 2))
    h = eb.avg_pool2d(h, 2, 2, 0).map(lambda a: a.reshape(a.shape[0], -1))
    out = eb.linear(h, sd["9.weight"], sd["9.bias"])
    assert out.holds(ours, theirs) <= 1


def test_transformer_block_converted_same_weights_same_outputs():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 48, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True)
    with torch.no_grad():
        for p in (layer.norm1.bias, layer.norm2.bias, layer.norm1.weight):
            p.add_(torch.randn(p.shape) * 0.1)
    block = nn.from_torch(layer)
    assert isinstance(block, nn.TransformerBlock) and block.training
    _same_state(block, layer)
    x = np.random.default_rng(2).standard_normal((2, 6, 32)).astype(np.float32)
    causal = backend.to_numpy(nn.causal_mask(6))
    ours = _np(block(Tensor(x), attn_mask=causal))
    seen, handles = _inputs(layer, {"norm1": layer.norm1, "norm2": layer.norm2})
    with sdpa_kernel(SDPBackend.MATH):
        theirs = layer(torch.tensor(x), src_mask=torch.tensor(causal)).detach().numpy()
    for handle in handles:
        handle.remove()

    sd = _torch_state(layer)
    e, heads = 32, 2
    d = e // heads
    xb = eb.Bound(x)
    h = eb.layer_norm(xb, sd["norm1.weight"], sd["norm1.bias"], seen["norm1"])
    proj = eb.linear(h, sd["self_attn.in_proj_weight"], sd["self_attn.in_proj_bias"])

    def part(i):
        return proj.map(lambda a: a[..., i * e:(i + 1) * e].reshape(2, 6, heads, d)
                        .transpose(0, 2, 1, 3))

    q, k, v = part(0), part(1), part(2)
    scores = eb.matmul(eb.scale(q, 0.5), eb.scale(k, 0.5).map(lambda a: a.swapaxes(-1, -2)))
    p = eb.softmax(eb.masked(scores, causal[None, None]))
    o = eb.matmul(p, v).map(lambda a: a.transpose(0, 2, 1, 3).reshape(2, 6, e))
    attended = eb.linear(o, sd["self_attn.out_proj.weight"], sd["self_attn.out_proj.bias"])
    x1 = eb.add(xb, attended)
    h2 = eb.layer_norm(x1, sd["norm2.weight"], sd["norm2.bias"], seen["norm2"])
    hidden = eb.gelu(eb.linear(h2, sd["linear1.weight"], sd["linear1.bias"]))
    out = eb.add(x1, eb.linear(hidden, sd["linear2.weight"], sd["linear2.bias"]))
    assert out.holds(ours, theirs) <= 1


def test_other_layers_convert():
    torch.manual_seed(3)
    model = torch.nn.ModuleList([
        torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Sigmoid(),
        torch.nn.GELU(approximate="tanh"),
        torch.nn.MultiheadAttention(4, 2, batch_first=True),
        torch.nn.LSTM(4, 3, batch_first=True)])
    ours = nn.from_torch(model)
    assert [type(m).__name__ for m in ours] == ["Embedding", "LayerNorm", "Tanh", "Sigmoid",
                                                 "GELU", "MultiheadAttention", "LSTM"]
    assert ours[4].approximate == "tanh"
    mine = ours.state_dict()
    for name, value in _torch_state(model).items():
        key = name.replace("_l0", "")
        np.testing.assert_array_equal(mine[key], value)
    # LSTM: same layout, so the same function (compared in float64)
    lstm = model[6].double()
    with use_policy("64-true"):
        ours_lstm = nn.from_torch(lstm)
        x = np.random.default_rng(4).standard_normal((2, 5, 4))
        out, (h, c) = ours_lstm(Tensor(x))
    t_out, (t_h, t_c) = lstm(torch.tensor(x))
    np.testing.assert_allclose(_np(out), t_out.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_np(c), t_c[0].detach().numpy(), rtol=1e-12, atol=1e-14)


def test_unsupported_layers_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unsupported layer Conv3d at '1'; supported: Linear"):
        nn.from_torch(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Conv3d(1, 1, 1)))

    with pytest.raises(ValueError, match="unsupported layer PixelShuffle"):
        nn.from_torch(torch.nn.PixelShuffle(2))     # a subclass with its own forward: traced
    for layer, why in ((torch.nn.MaxPool2d(2, ceil_mode=True), "ceil_mode"),
                       (torch.nn.BatchNorm2d(3, momentum=None), "momentum=None"),
                       (torch.nn.MultiheadAttention(4, 2, kdim=3), "kdim"),
                       (torch.nn.LSTM(2, 3, bidirectional=True, batch_first=True),
                        "unidirectional"),
                       (torch.nn.Embedding(3, 2, max_norm=1.0), "max_norm")):
        with pytest.raises(ValueError, match=why):
            nn.from_torch(layer)


def _same_function(theirs, ours, x, indices=False):
    """Outputs and the gradients of their sum agree (both in float64), parameter by parameter
    under the same names; returns the loss's torch model for further steps."""
    t_in = torch.tensor(x)
    t_out = theirs(t_in)
    t_out.sum().backward()
    out = ours(x if indices else Tensor(x))
    out.sum().backward()
    np.testing.assert_allclose(_np(out), t_out.detach().numpy(), rtol=1e-12, atol=1e-14)
    mine = dict(ours.named_parameters())
    assert list(mine) == [name for name, _ in theirs.named_parameters()]
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(_np(mine[name].grad), p.grad.numpy(), rtol=1e-12,
                                   atol=1e-14)


def test_module_used_twice_is_one_module_used_twice():
    from fpsim.optim import SGD, Optimizer

    torch.manual_seed(5)
    lin = torch.nn.Linear(3, 3)
    model = torch.nn.Sequential(lin, torch.nn.Tanh(), lin)
    x = np.random.default_rng(6).standard_normal((4, 3))
    with use_policy("64-true"):
        ours = nn.from_torch(model.double())
        assert ours[0] is ours[2] and len(ours) == 3
        _same_function(model, ours, x)
    model.float().zero_grad()
    ours = nn.from_torch(model)                 # the optimizer simulates fp32 weights
    before = _np(ours[0].weight).copy()
    ours(Tensor(x.astype(np.float32))).sum().backward()
    optimizer = Optimizer(ours, SGD(lr=0.25), master=None)
    assert [name for name, _ in optimizer.named] == ["0.weight", "0.bias"]
    optimizer.step()
    np.testing.assert_array_equal(_np(ours[2].weight),     # one step, not one per use
                                  before - np.float32(0.25) * _np(ours[0].weight.grad))
    model(torch.tensor(x, dtype=torch.float32)).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.25).step()
    np.testing.assert_allclose(_np(ours[2].weight), lin.weight.detach().numpy(), rtol=1e-6)


def test_tied_weights_stay_one_parameter():
    torch.manual_seed(7)
    embedding, head = torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False)
    head.weight = embedding.weight                          # tied input and output embedding
    model = torch.nn.Sequential(embedding, torch.nn.LayerNorm(4), head).double()
    with use_policy("64-true"):
        ours = nn.from_torch(model)
        assert ours[2].weight is ours[0].weight
        _same_function(model, ours, np.array([[0, 3, 1], [4, 4, 2]]), indices=True)


def test_container_own_state_and_modes_carry_over():
    torch.manual_seed(8)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Dropout(0.5))
    model.register_parameter("scale", torch.nn.Parameter(torch.randn(3)))
    model.register_buffer("shift", torch.randn(2))
    model[1].eval()                                 # the container stays in training mode
    ours = nn.from_torch(model)
    _same_state(ours, model)
    assert "scale" in dict(ours.named_parameters())
    assert "shift" in dict(ours.named_buffers())
    assert ours.training and ours[0].training and not ours[1].training
    named = torch.nn.Sequential(OrderedDict(fc=torch.nn.Linear(2, 2), act=torch.nn.ReLU()))
    _same_state(nn.from_torch(named), named)        # "fc.weight", not "0.weight"
    model.register_buffer("steps", torch.zeros((), dtype=torch.int64))
    with pytest.raises(ValueError, match=r"Sequential: its own buffer 'steps' is torch.int64"):
        nn.from_torch(model)


def _refusal(model):
    with pytest.raises(ValueError) as caught:
        nn.from_torch(model)
    message = str(caught.value)
    assert message.startswith("from_torch: ") and "\n" not in message
    return message


def test_frozen_and_aliased_parameters_are_refused_by_name():
    frozen = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(2, 2))
    frozen[1].weight.requires_grad_(False)
    assert "Linear at '1': parameter '1.weight' is frozen (requires_grad=False)" in \
        _refusal(frozen)
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    second.weight = torch.nn.Parameter(first.weight.data)   # one memory, two Parameters
    assert "'1.weight' shares memory with '0.weight'" in \
        _refusal(torch.nn.Sequential(first, second))
    first_norm, second_norm = torch.nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)
    second_norm.running_mean = first_norm.running_mean
    assert "buffer '1.running_mean' is also '0.running_mean'" in \
        _refusal(torch.nn.Sequential(first_norm, second_norm))
    extra = torch.nn.Linear(2, 2)
    extra.register_parameter("gain", torch.nn.Parameter(torch.ones(2)))
    assert "Linear: its parameters and buffers do not fit fpsim's" in _refusal(extra)
    mixed = torch.nn.TransformerEncoderLayer(4, 2, batch_first=True, norm_first=True)
    mixed.dropout1.eval()
    assert "Dropout at 'dropout1': training=False inside a layer with training=True" in \
        _refusal(mixed)


def test_hooks_are_refused_by_name():
    def hook(*args):
        return None

    for register, held in (("register_forward_hook", "forward hooks"),
                           ("register_forward_pre_hook", "forward pre hooks"),
                           ("register_full_backward_hook", "backward hooks"),
                           ("register_full_backward_pre_hook", "backward pre hooks")):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        getattr(model[1], register)(hook)
        assert f"ReLU at '1': has {held}, which fpsim cannot run" in _refusal(model)
        getattr(model, register)(hook)
        assert f"Sequential: has {held}" in _refusal(model)
    inner = torch.nn.TransformerEncoderLayer(4, 2, batch_first=True, norm_first=True)
    inner.linear1.register_forward_hook(hook)
    assert "Linear at 'linear1': has forward hooks" in _refusal(inner)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model[0].bias.register_hook(hook)
    assert "'0.bias' has backward hooks" in _refusal(model)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        assert "torch has global forward hooks registered for every module" in _refusal(model)
    finally:
        handle.remove()
    assert isinstance(nn.from_torch(model), nn.Sequential)
