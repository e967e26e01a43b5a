"""fpsim.nn.from_torch on any torch.nn.Module, by tracing (fpsim.nn.traced): real models
(a torchvision-style ResNet, a post-LN ``TransformerEncoder`` with batch_first=False, and a
tiny GPT-2 where ``transformers`` is installed) convert with torch's state-dict keys and
values bit for bit, give torch's forward under "32-true" within the layer-by-layer bound of
``error_bounds``, and train under "16-mixed"; what cannot be run is refused in one line
before any weight is copied.
"""
import warnings

import numpy as np
import pytest

from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy
from fpsim.train import Dataset, train

import error_bounds as eb

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _np(t):
    return backend.to_numpy(t.data)


def _same_state(ours, theirs):
    mine = ours.state_dict()
    reference = {k: v.detach().numpy() for k, v in theirs.state_dict().items()
                 if k in mine or not k.endswith("num_batches_tracked")}
    assert list(mine) == list(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(mine[name], value, strict=False)
        if value.dtype == np.float32:
            np.testing.assert_array_equal(mine[name].view(np.uint32), value.view(np.uint32))


class BasicBlock(torch.nn.Module):
    """torchvision's ResNet BasicBlock."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = torch.nn.Sequential(
                torch.nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                torch.nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(torch.nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU(inplace=True)
        self.layer1 = torch.nn.Sequential(BasicBlock(4, 4))
        self.layer2 = torch.nn.Sequential(BasicBlock(4, 8, stride=2))
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(8, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def _resnet():
    torch.manual_seed(0)
    net = ResNet()
    net(torch.randn(16, 1, 8, 8))       # a training step moves the running statistics
    return net


def _block_bound(h, sd, prefix, stride):
    def bn(b, name):
        return eb.batch_norm_eval(b, sd[f"{name}.running_mean"], sd[f"{name}.running_var"],
                                  sd[f"{name}.weight"], sd[f"{name}.bias"])
    out = eb.relu(bn(eb.conv2d(h, sd[f"{prefix}.conv1.weight"], None, stride, 1, 1, 1),
                     f"{prefix}.bn1"))
    out = bn(eb.conv2d(out, sd[f"{prefix}.conv2.weight"], None, 1, 1, 1, 1), f"{prefix}.bn2")
    if f"{prefix}.downsample.0.weight" in sd:
        h = bn(eb.conv2d(h, sd[f"{prefix}.downsample.0.weight"], None, stride, 0, 1, 1),
               f"{prefix}.downsample.1")
    return eb.relu(eb.add(out, h))


def test_resnet_converts_with_torchs_names_and_forward():
    net = _resnet().eval()
    with use_policy("32-true"):
        model = nn.from_torch(net)
        x = np.random.default_rng(1).standard_normal((5, 1, 8, 8)).astype(np.float32)
        ours = _np(model(Tensor(x)))
    _same_state(model, net)
    assert not model.training and isinstance(model.layer1[0].conv1, nn.Conv2d)
    assert model.layer2[0].downsample[1].running_var.fmt.name == "fp32"
    theirs = net(torch.tensor(x)).detach().numpy()

    sd = {k: v.detach().numpy().astype(np.float64) for k, v in net.state_dict().items()}
    h = eb.conv2d(eb.Bound(x), sd["conv1.weight"], None, 1, 1, 1, 1)
    h = eb.relu(eb.batch_norm_eval(h, sd["bn1.running_mean"], sd["bn1.running_var"],
                                   sd["bn1.weight"], sd["bn1.bias"]))
    h = _block_bound(_block_bound(h, sd, "layer1.0", 1), sd, "layer2.0", 2)
    h = eb.avg_pool2d(h, 4, 4, 0).map(lambda a: a.reshape(a.shape[0], -1))
    out = eb.linear(h, sd["fc.weight"], sd["fc.bias"])
    assert out.holds(ours, theirs) <= 1


def test_resnet_gradients_are_torchs_in_float64():
    """The residual adds (x feeding both a convolution and the sum) pass every gradient."""
    net = _resnet().eval().double()
    x = np.random.default_rng(3).standard_normal((3, 1, 8, 8))
    with use_policy("64-true"):
        model = nn.from_torch(net)
        inputs = Tensor(x, requires_grad=True)
        model(inputs).sum().backward()
    theirs = torch.tensor(x, requires_grad=True)
    net(theirs).sum().backward()
    np.testing.assert_allclose(_np(inputs.grad), theirs.grad.numpy(), rtol=1e-12, atol=1e-15)
    reference = dict(net.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_np(p.grad), reference[name].grad.numpy(), rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def _trains(model, data, policy="16-mixed"):
    result = train(model, data, policy=policy, steps=3, batch_size=8, seed=0)
    assert len(result.losses) == 3 and np.all(np.isfinite(result.losses))
    return result


def test_resnet_trains_under_16_mixed_and_loads_torchs_state_dict():
    net = _resnet().train()
    with use_policy("16-mixed"):
        model = nn.from_torch(net)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 1, 8, 8)).astype(np.float32)
    _trains(model, Dataset(x, (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64), classes=3,
                           name="images"))
    torch_state = {k: v.numpy() for k, v in net.state_dict().items()
                   if not k.endswith("num_batches_tracked") or k in model.state_dict()}
    model.load_state_dict(torch_state)          # the names line up: back to torch's values
    _same_state(model, net)


def _encoder(norm=True):
    torch.manual_seed(4)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 48, dropout=0.0)     # post-LN, (L, B, E)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # "enable_nested_tensor is True, but ..."
        encoder = torch.nn.TransformerEncoder(layer, 2,
                                              norm=torch.nn.LayerNorm(32) if norm else None)
    with torch.no_grad():
        for p in encoder.parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape) * 0.1)
    return encoder


def _post_ln_bound(x, sd, prefix, seen, length, batch, heads=2, e=32):
    d = e // heads
    proj = eb.linear(x, sd[f"{prefix}.self_attn.in_proj_weight"],
                     sd[f"{prefix}.self_attn.in_proj_bias"])

    def part(i):        # (L, B, E) -> (B, H, L, D)
        return proj.map(lambda a: a[..., i * e:(i + 1) * e].reshape(length, batch, heads, d)
                        .transpose(1, 2, 0, 3))

    q, k, v = part(0), part(1), part(2)
    scores = eb.matmul(eb.scale(q, 0.5), eb.scale(k, 0.5).map(lambda a: a.swapaxes(-1, -2)))
    o = eb.matmul(eb.softmax(scores), v).map(
        lambda a: a.transpose(2, 0, 1, 3).reshape(length, batch, e))
    attended = eb.linear(o, sd[f"{prefix}.self_attn.out_proj.weight"],
                         sd[f"{prefix}.self_attn.out_proj.bias"])
    x1 = eb.layer_norm(eb.add(x, attended), sd[f"{prefix}.norm1.weight"],
                       sd[f"{prefix}.norm1.bias"], seen[f"{prefix}.norm1"])
    hidden = eb.relu(eb.linear(x1, sd[f"{prefix}.linear1.weight"],
                               sd[f"{prefix}.linear1.bias"]))
    ff = eb.linear(hidden, sd[f"{prefix}.linear2.weight"], sd[f"{prefix}.linear2.bias"])
    return eb.layer_norm(eb.add(x1, ff), sd[f"{prefix}.norm2.weight"],
                         sd[f"{prefix}.norm2.bias"], seen[f"{prefix}.norm2"])


def test_post_ln_transformer_encoder_sequence_first_gives_torchs_forward():
    """torch's defaults (post-LN, batch_first=False); head size 16, so the math kernel's
    q and k scalings by 16**-1/4 are exact (see test_from_torch.py)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    encoder = _encoder()
    with use_policy("32-true"):
        ours_model = nn.from_torch(encoder)
        x = np.random.default_rng(5).standard_normal((6, 3, 32)).astype(np.float32)
        ours = _np(ours_model(Tensor(x)))
    assert isinstance(ours_model, nn.TransformerEncoder)
    assert not ours_model.layers[0].norm_first and not ours_model.layers[0].self_attn.batch_first
    _same_state(ours_model, encoder)

    seen, handles = {}, []
    for name, module in encoder.named_modules():
        if isinstance(module, torch.nn.LayerNorm):
            def keep(mod, args, out, name=name):
                seen[name] = args[0].detach().numpy()
            handles.append(module.register_forward_hook(keep))
    with sdpa_kernel(SDPBackend.MATH):
        theirs = encoder(torch.tensor(x)).detach().numpy()
    for handle in handles:
        handle.remove()

    sd = {k: v.detach().numpy().astype(np.float64) for k, v in encoder.state_dict().items()}
    h = eb.Bound(x)
    for i in range(2):
        h = _post_ln_bound(h, sd, f"layers.{i}", seen, 6, 3)
    out = eb.layer_norm(h, sd["norm.weight"], sd["norm.bias"], seen["norm"])
    assert out.holds(ours, theirs) <= 1


class Tagger(torch.nn.Module):
    """Tokens in, a label per token out, around a sequence-first encoder: a model with its own
    forward (transposes, a causal mask buffer, a method chain) that only tracing converts."""

    def __init__(self, vocab=8, length=6):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 32)
        self.encoder = _encoder(norm=False)
        self.head = torch.nn.Linear(32, vocab)
        self.register_buffer("causal", torch.triu(torch.ones(length, length,
                                                             dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, ids):
        h = self.embed(ids).transpose(0, 1)                 # (L, B, E)
        h = self.encoder(h, mask=self.causal)
        return self.head(h.permute(1, 0, 2).contiguous())   # (B, L, vocab)


def test_a_model_around_the_encoder_converts_and_trains():
    torch.manual_seed(6)
    tagger = Tagger()
    ids = np.random.default_rng(7).integers(0, 8, (3, 6))
    with use_policy("32-true"):
        model = nn.from_torch(tagger)
        ours = _np(model(ids))
    _same_state(model, tagger)
    theirs = tagger(torch.tensor(ids)).detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-5)    # the bound: test above
    with use_policy("16-mixed"):
        model = nn.from_torch(tagger)
    tokens = np.random.default_rng(8).integers(0, 8, (32, 6))
    _trains(model, Dataset(tokens, np.roll(tokens, 1, axis=1), classes=8, name="tokens"))


class Calls(torch.nn.Module):
    """A model whose forward calls ``fn`` after a layer, beside a frozen parameter (which
    copying would refuse): the node is refused first, before any weight is copied."""

    def __init__(self, fn):
        super().__init__()
        self.block2 = torch.nn.Module()
        self.block2.attn = torch.nn.Linear(4, 4)
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.block2.attn(x))


def _refused(model, *fragments):
    example = (torch.ones(2),) if "exported" in fragments[0] else None
    with pytest.raises(ValueError) as err:
        nn.from_torch(model, example=example)
    message = str(err.value)
    assert "\n" not in message and message.startswith("from_torch: ")
    for fragment in fragments:
        assert fragment in message, message


def test_what_cannot_run_is_refused_in_one_line_by_name_and_place():
    _refused(Calls(torch.erf), "from_torch: model: torch.erf is not supported; supported "
                               "functions: ", "torch.nn.functional.gelu")
    _refused(Calls(lambda h: h.float()), "the tensor method .float() is not supported",
             "methods: ")
    _refused(Calls(lambda h: F.softmax(h, -1, dtype=torch.float64)), "torch.float64",
             "arguments: numbers")

    class Inner(torch.nn.Module):
        def forward(self, x):
            return F.hardswish(x)

    traced = Calls(lambda h: h)
    traced.block2.attn = Inner()
    _refused(traced, "model.block2.attn: torch.nn.functional.hardswish is not supported")

    shuffle = Calls(lambda h: h)
    shuffle.block2.attn = torch.nn.PixelShuffle(2)
    _refused(shuffle, "model.block2.attn: torch.nn.modules.pixelshuffle.PixelShuffle is not "
                      "supported; supported layers: Linear, ")

    class Branches(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    _refused(Branches(), "model (Branches) cannot be traced by torch.fx",
             "give example=(inputs,) to convert it through torch.export")
    _refused(Branches(), "model (Branches) cannot be exported by torch.export either")
    with pytest.raises(TypeError, match="from_torch: module must be a torch.nn.Module, got"):
        nn.from_torch(np.ones(3))


def test_sharing_constants_and_arguments_in_a_traced_model():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(5, 4)
            self.out = torch.nn.Linear(4, 5, bias=False)
            self.out.weight = self.embed.weight         # tied, as language models tie them
            self.mix = torch.nn.Linear(4, 4)
            self.register_buffer("offset", torch.arange(3), persistent=False)

        def forward(self, ids, scale=2.0):
            h = self.mix(self.mix(self.embed(ids + self.offset)))    # one layer, used twice
            h = torch.cat([h, h * scale], dim=0).view(2, ids.size(0), 3, 4)
            return self.out(h.mean(0)).transpose(1, 2).sum(-1)

    torch.manual_seed(9)
    tied = Tied()
    with use_policy("32-true"):
        model = nn.from_torch(tied)
        ids = np.array([[0, 1, 1], [1, 0, 0]])
        out = model(ids, scale=3.0)
    assert model.out.weight is model.embed.weight
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in tied.named_parameters()]
    np.testing.assert_allclose(_np(out), tied(torch.tensor(ids), 3.0).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match=r"the traced model takes \(ids, scale\)"):
        model(ids, bad=1)


def test_fp8_recipe_reaches_the_traced_models_layers():
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.down(F.gelu(self.up(x))) + x

    torch.manual_seed(10)
    with use_policy("bf16-mixed"):
        model = nn.from_torch(Mlp())
    x = np.random.default_rng(11).standard_normal((32, 16)).astype(np.float32)
    result = _trains(model, Dataset(x, x[:, :4].argmax(axis=1), classes=16, name="rows"),
                     policy="fp8-delayed")
    assert {name.split(".")[0] for name in result.fp8_names} >= {"up", "down"}


def _gpt2(batch=8, length=8):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, attn_pdrop=0.0, resid_pdrop=0.0,
                                     embd_pdrop=0.0)
    torch.manual_seed(12)

    class LanguageModel(torch.nn.Module):     # logits only: what a loss takes
        def __init__(self):
            super().__init__()
            self.gpt = transformers.GPT2LMHeadModel(config)

        def forward(self, ids):
            return self.gpt(ids, use_cache=False, return_dict=False)[0]

    model = LanguageModel()
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(13))
    return model, ids


def test_tiny_gpt2_converts_through_torch_export_and_trains():
    """fx cannot trace GPT2LMHeadModel; with example inputs torch.export records its ATen ops.
    The bound: fpsim's distance to the float64 evaluation at most twice PyTorch's fp32 one
    plus 2**-22 of the largest logit (both are first-order fp32 evaluations of the same
    graph; a layer-by-layer bound as above would restate GPT-2's forward)."""
    model, ids = _gpt2()
    with pytest.raises(ValueError, match=r"^from_torch: model \(LanguageModel\) cannot be "
                                         r"traced by torch.fx .*give example=\(inputs,\)"):
        nn.from_torch(model)
    with use_policy("32-true"):
        ours_model = nn.from_torch(model, example=(ids,))
        ours = _np(ours_model(ids.numpy()))
    tied = {"gpt.lm_head.weight"}     # tied to gpt.transformer.wte.weight: listed once here
    assert list(ours_model.state_dict()) == [k for k in model.state_dict() if k not in tied]
    assert ours_model.gpt.lm_head.weight is ours_model.gpt.transformer.wte.weight
    for name, value in ours_model.state_dict().items():
        np.testing.assert_array_equal(value.view(np.uint32),
                                      model.state_dict()[name].numpy().view(np.uint32))
    torch_state = {k: v.numpy() for k, v in model.state_dict().items()}
    ours_model.load_state_dict(torch_state)     # torch's keys, the tied one included
    torch_state["gpt.lm_head.weight"] = torch_state["gpt.lm_head.weight"] + 1
    with pytest.raises(ValueError, match="'gpt.lm_head.weight' is tied to "
                                         "'gpt.transformer.wte.weight' here but holds other"):
        ours_model.load_state_dict(torch_state)
    theirs = model(ids).detach().numpy()
    exact = model.double()(ids).detach().numpy()
    model.float()
    scale = np.abs(exact).max()
    assert np.abs(ours - exact).max() <= 2 * np.abs(theirs - exact).max() + 2.0 ** -22 * scale
    with use_policy("32-true"):     # the batch size stayed free (Dim.AUTO)
        assert ours_model(ids.numpy()[:3]).shape == (3, 8, 64)

    with use_policy("16-mixed"):
        mixed = nn.from_torch(model, example=(ids,))
    tokens = np.random.default_rng(14).integers(0, 64, (32, 8))
    result = _trains(mixed, Dataset(tokens, np.roll(tokens, -1, axis=1), classes=64,
                                    name="tokens"))
    assert result.losses[0] > 0


def test_export_route_refuses_what_it_cannot_run():
    model, ids = _gpt2(batch=2)
    with pytest.raises(ValueError, match=r"^from_torch: model.gpt.transformer.h.0.attn: "
                                         r"aten\.\S+ is not supported on the torch.export route"):
        from fpsim.nn import exported_ops
        saved = exported_ops.ATEN.pop("aten.split.Tensor")
        try:
            nn.from_torch(model, example=(ids,))
        finally:
            exported_ops.ATEN["aten.split.Tensor"] = saved
    with pytest.raises(TypeError, match="example must be a tuple"):
        nn.from_torch(model, example=ids)


def test_fp8_recipe_and_keep_reach_the_exported_models_gemms():
    """Each ATen GEMM keeps its FP8 state in the module that called it, under its name."""
    model, ids = _gpt2()
    with use_policy("bf16-mixed"):
        ours = nn.from_torch(model, example=(ids,))
    tokens = np.random.default_rng(15).integers(0, 64, (32, 8))
    data = Dataset(tokens, np.roll(tokens, -1, axis=1), classes=64, name="tokens")
    result = _trains(ours, data, policy="fp8-delayed:keep=gpt.lm_head")
    quantized = {name.rsplit(".", 1)[0] for name in result.fp8_names}
    assert "gpt.transformer.h.1.mlp.c_fc" in quantized and "gpt.lm_head" not in quantized


class CausalSelfAttention(torch.nn.Module):
    """minGPT's attention, written by hand: sizes unpacked, a mask buffer sliced by them and
    compared with 0, ``math.sqrt`` of a size, ``@``, ``masked_fill``, ``F.softmax``."""

    def __init__(self, n_embd=16, n_head=2, block_size=8):
        super().__init__()
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = torch.nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        import math

        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def test_hand_written_attention_converts_and_backpropagates():
    torch.manual_seed(16)
    attention = CausalSelfAttention()
    x = np.random.default_rng(17).standard_normal((2, 6, 16)).astype(np.float32)
    with use_policy("32-true"):
        model = nn.from_torch(attention)
        inputs = Tensor(x, requires_grad=True)
        out = model(inputs)
        out.sum().backward()
    _same_state(model, attention)
    theirs = torch.tensor(x, requires_grad=True)
    attention(theirs).sum().backward()
    # fp32 evaluations of the same ops (the encoder test's bound covers such a chain)
    np.testing.assert_allclose(_np(out), attention(torch.tensor(x)).detach().numpy(),
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(_np(inputs.grad), theirs.grad.numpy(), rtol=0, atol=1e-5)


def test_gpt2_gradients_are_torchs_in_float64():
    model, ids = _gpt2(batch=2)
    model.double()
    with use_policy("64-true"):
        ours = nn.from_torch(model, example=(ids,))
        out = ours(ids.numpy())
        (out * out).sum().backward()
    theirs = model(ids)
    np.testing.assert_allclose(_np(out), theirs.detach().numpy(), rtol=0, atol=1e-12)
    (theirs * theirs).sum().backward()
    reference = dict(model.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(_np(p.grad), reference[name].grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
