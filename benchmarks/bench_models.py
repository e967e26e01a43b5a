"""One training step of the models issues 26 and 44 name: a small CNN (two 3x3
convolutions, 1x28x28 inputs, batch 64) and a 2-block pre-LN transformer on tokens (d=64,
4 heads, sequence 32, batch 16, ``fpsim.train.models.TokenTransformer``); and larger rows of
each family: a residual CNN with BatchNorm (3x32x32 inputs, 16 and 32 channels, a residual
block at each size, batch 64) and a 4-block transformer LM (d=256, 8 heads, sequence 128,
batch 8). Each under "32-true" and "16-mixed", beside the float64 floor of the step's
products (the exact model cannot be faster than its float64 products) and PyTorch's float32
eager step of the same model on the CPU; under each step, how its exact products, row sums
and correctly rounded functions ran (how often each certificate left elements to its
fallback) and the step's peak memory (tracemalloc, in a fresh thread so that the per-thread
work buffers count).

Target (issue 26): each step within 3x its float64 floor. Also printed: the convolution's
peak memory, forward, dx and dW, measured with tracemalloc, against the input's size
(target, issue 44: under 4x).

Each time is the fastest of ``--repeat`` rounds of about ``--budget / --repeat`` seconds, the
rows taking turns.

Run: python benchmarks/bench_models.py [--repeat N] [--budget S] [--only small|large]
"""
from __future__ import annotations

import argparse
import threading
import tracemalloc

import numpy as np

from _timing import seconds_per_call as _seconds

from fpsim import nn
from fpsim.autograd import Tensor, use_policy
from fpsim.exact.sums import SUM_ROWS
from fpsim.exact.correctly_rounded import FALLBACK_COUNT
from fpsim.exact.product_count import count_products
from fpsim.optim import SGD, Optimizer
from fpsim.rounding import use_compiled
from fpsim.rounding.compiled import available as compiled_available
from fpsim.train.losses import batch_inputs, resolve_loss
from fpsim.train import Dataset

CNN_BATCH, CNN_CHANNELS = 64, (8, 16)
LR = 0.01


def cnn(seed=0):
    return nn.Sequential(
        nn.Conv2d(1, CNN_CHANNELS[0], 3, padding=1, rng=seed), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(CNN_CHANNELS[0], CNN_CHANNELS[1], 3, padding=1, rng=seed + 1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(CNN_CHANNELS[1] * 7 * 7, 10, rng=seed + 2))


def cnn_data():
    rng = np.random.default_rng(0)
    return Dataset(rng.standard_normal((CNN_BATCH, 1, 28, 28)).astype(np.float32),
                   rng.integers(0, 10, CNN_BATCH), 10, "bench")


def engine_step(make_model, data, policy):
    """Forward, loss, backward and an SGD update (master fp32 under 16-mixed)."""
    with use_policy(policy):
        model = make_model()
        optimizer = Optimizer(model, SGD(lr=LR), master="fp32" if "mixed" in policy else None)
    loss_fn, _ = resolve_loss("auto", data)
    from fpsim.scaling import NoScaler
    state = NoScaler().init()

    def step():
        with use_policy(policy):
            loss_fn(model(batch_inputs(data.x)), data.y).backward()
        optimizer.step(state)
        optimizer.zero_grad()

    return step


def cnn_floor(batch=CNN_BATCH):
    """The float64 products of one exact CNN step: per convolution the im2col forward
    product, the weight gradient and (above the first layer) the input gradient
    (``conv_products``), and the read-out's three products."""
    rng = np.random.default_rng(0)
    shapes = []
    depth, size = 1, 28
    for i, out in enumerate(CNN_CHANNELS):
        shapes += conv_products(batch, depth, out, size, input_gradient=i > 0)
        depth, size = out, size // 2
    features = depth * size * size
    shapes += [((batch, features), (features, 10)), ((10, batch), (batch, features)),
               ((batch, 10), (10, features))]
    pairs = [(rng.standard_normal(a), rng.standard_normal(b)) for a, b in shapes]
    return lambda: [a @ b for a, b in pairs]


def torch_cnn_step():
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, CNN_CHANNELS[0], 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(CNN_CHANNELS[0], CNN_CHANNELS[1], 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(CNN_CHANNELS[1] * 49, 10))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = torch.randn(CNN_BATCH, 1, 28, 28), torch.randint(0, 10, (CNN_BATCH,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


D_MODEL, HEADS, LENGTH, T_BATCH, VOCAB = 64, 4, 32, 16, 64
#: the large row (issue 44): 4 blocks, d=256, 8 heads, sequence 128
LARGE_LM = {"d_model": 256, "heads": 8, "length": 128, "batch": 8, "vocab": 256, "blocks": 4}


def transformer(seed=0, *, d_model=D_MODEL, heads=HEADS, length=LENGTH, vocab=VOCAB,
                blocks=2):
    from fpsim.train.models import TokenTransformer
    return TokenTransformer(vocab, vocab, length, d_model=d_model, heads=heads, blocks=blocks,
                            seed=seed)


def token_data(*, length=LENGTH, batch=T_BATCH, vocab=VOCAB):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (batch, length))
    return Dataset(ids, rng.integers(0, vocab, (batch, length)), vocab, "bench")


def transformer_floor(*, d_model=D_MODEL, heads=HEADS, length=LENGTH, batch=T_BATCH,
                      vocab=VOCAB, blocks=2):
    """The float64 products of one exact step: each forward product of the blocks and the
    read-out (projections, scores, weights @ values, the MLP), and two backward products of
    each shape (the gradients of both operands)."""
    rng = np.random.default_rng(0)
    rows, head, stack = batch * length, d_model // heads, batch * heads
    block = [((rows, d_model), (d_model, 3 * d_model)),
             ((stack, length, head), (stack, head, length)),
             ((stack, length, length), (stack, length, head)),
             ((rows, d_model), (d_model, d_model)), ((rows, d_model), (d_model, 4 * d_model)),
             ((rows, 4 * d_model), (4 * d_model, d_model))]
    shapes = block * blocks + [((rows, d_model), (d_model, vocab))]
    pairs = [(rng.standard_normal(a), rng.standard_normal(b)) for a, b in shapes]
    return lambda: [a @ b for _ in range(3) for a, b in pairs]


def torch_transformer_step(*, d_model=D_MODEL, heads=HEADS, length=LENGTH, batch=T_BATCH,
                           vocab=VOCAB, blocks=2):
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, 0.0, "gelu",
                                               batch_first=True, norm_first=True)
              for _ in range(blocks)]
    token, position = torch.nn.Embedding(vocab, d_model), torch.nn.Embedding(length, d_model)
    norm, head = torch.nn.LayerNorm(d_model), torch.nn.Linear(d_model, vocab)
    modules = torch.nn.ModuleList([*layers, token, position, norm, head])
    opt = torch.optim.SGD(modules.parameters(), lr=LR)
    ids = torch.randint(0, vocab, (batch, length))
    labels = torch.randint(0, vocab, (batch, length))
    mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)

    def step():
        opt.zero_grad()
        x = token(ids) + position(torch.arange(length))
        for layer in layers:
            x = layer(x, src_mask=mask)
        logits = head(norm(x))
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1)).backward()
        opt.step()

    return step


# --- the large CNN (issue 44): 3x32x32 inputs, residual blocks with BatchNorm, batch 64 ------
LARGE_CNN_BATCH, LARGE_CNN_CHANNELS, LARGE_SIZE, CLASSES = 64, (16, 32), 32, 10


class ResidualBlock(nn.Module):
    """``relu(x + bn(conv(relu(bn(conv(x))))))``, 3x3 convolutions keeping size and channels."""

    def __init__(self, channels, rng):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False, rng=rng)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False, rng=rng)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return (x + self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))).relu()


def large_cnn(seed=0):
    """Stem 3 -> 16 (conv, BN, ReLU) and a residual block at 32x32; a stride-2 convolution to
    32 channels (BN, ReLU) and a residual block at 16x16; global average pooling; linear."""
    rng = nn.init.as_rng(seed)
    first, second = LARGE_CNN_CHANNELS
    return nn.Sequential(
        nn.Conv2d(3, first, 3, padding=1, bias=False, rng=rng), nn.BatchNorm2d(first),
        nn.ReLU(), ResidualBlock(first, rng),
        nn.Conv2d(first, second, 3, stride=2, padding=1, bias=False, rng=rng),
        nn.BatchNorm2d(second), nn.ReLU(), ResidualBlock(second, rng),
        nn.AvgPool2d(LARGE_SIZE // 2), nn.Flatten(), nn.Linear(second, CLASSES, rng=rng))


def large_cnn_data():
    rng = np.random.default_rng(0)
    images = rng.standard_normal((LARGE_CNN_BATCH, 3, LARGE_SIZE, LARGE_SIZE))
    return Dataset(images.astype(np.float32), rng.integers(0, CLASSES, LARGE_CNN_BATCH),
                   CLASSES, "bench")


def conv_products(batch, c_in, c_out, out_size, input_gradient=True, kernel=9):
    """One convolution's dense im2col products: forward (N P Q, C k) @ (C k, O), dW
    (O, N P Q) @ (N P Q, C k) and, unless it is the first layer, dx's (N P Q, O) @ (O, C k)
    (before col2im: at stride 2 the engine's transposed convolution does more)."""
    rows, inner = batch * out_size * out_size, c_in * kernel
    shapes = [((rows, inner), (inner, c_out)), ((c_out, rows), (rows, inner))]
    return shapes + ([((rows, c_out), (c_out, inner))] if input_gradient else [])


def large_cnn_floor():
    """The float64 products of one exact step of ``large_cnn``: its six convolutions'
    (``conv_products``) and the read-out's three."""
    n, (first, second), size = LARGE_CNN_BATCH, LARGE_CNN_CHANNELS, LARGE_SIZE
    shapes = (conv_products(n, 3, first, size, input_gradient=False)
              + 2 * conv_products(n, first, first, size)
              + conv_products(n, first, second, size // 2)
              + 2 * conv_products(n, second, second, size // 2)
              + [((n, second), (second, CLASSES)), ((CLASSES, n), (n, second)),
                 ((n, CLASSES), (CLASSES, second))])
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal(a), rng.standard_normal(b)) for a, b in shapes]
    return lambda: [a @ b for a, b in pairs]


def torch_large_cnn_step():
    import torch
    torch.manual_seed(0)
    first, second = LARGE_CNN_CHANNELS

    class Block(torch.nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(channels), torch.nn.ReLU(),
                torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(channels))

        def forward(self, x):
            return torch.relu(x + self.body(x))

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, first, 3, padding=1, bias=False), torch.nn.BatchNorm2d(first),
        torch.nn.ReLU(), Block(first),
        torch.nn.Conv2d(first, second, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(second), torch.nn.ReLU(), Block(second),
        torch.nn.AvgPool2d(LARGE_SIZE // 2), torch.nn.Flatten(), torch.nn.Linear(second, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(LARGE_CNN_BATCH, 3, LARGE_SIZE, LARGE_SIZE)
    y = torch.randint(0, CLASSES, (LARGE_CNN_BATCH,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def peak_in_a_fresh_thread(call) -> int:
    """Peak bytes traced (NumPy's allocations) during ``call``, run in a new thread: its
    per-thread work buffers (``fpsim.backend.scratch``) start empty, so they count too."""
    peaks = []

    def traced():
        tracemalloc.start()
        try:
            call()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    thread = threading.Thread(target=traced)
    thread.start()
    thread.join()
    return peaks[0]


def conv_memory() -> dict:
    """Peak memory of the small CNN's second convolution (8 channels in, 16 out, 14x14,
    batch 64, fp32), forward, dx and dW, over its input's bytes: (all of it, beyond what
    the pass returns: the output, dx; dW is small). The incoming gradient is not counted."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CNN_BATCH, CNN_CHANNELS[0], 14, 14)).astype(np.float32)
    size, ratios = 4 * x.size, {}
    with use_policy("32-true"):
        for part in ("forward", "dx", "dW"):
            layer = nn.Conv2d(CNN_CHANNELS[0], CNN_CHANNELS[1], 3, padding=1, rng=0)
            inputs = Tensor(x, requires_grad=part == "dx")
            layer.weight.requires_grad = part == "dW"
            layer.bias.requires_grad = False
            out = layer(inputs)
            if part == "forward":
                peak = peak_in_a_fresh_thread(lambda: layer(inputs))
                returned = 4 * out.size
            else:
                seed = Tensor(rng.standard_normal(out.shape).astype(np.float32))
                peak = peak_in_a_fresh_thread(lambda: out.backward(seed))
                returned = size if part == "dx" else 0
            ratios[part] = (peak / size, (peak - returned) / size)
    return ratios


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per row")
    parser.add_argument("--only", choices=("small", "large"),
                        help="only the small rows (issue 26) or the large ones (issue 44)")
    args = parser.parse_args(argv)
    if args.only != "large":
        report(f"small CNN (conv {CNN_CHANNELS}, 1x28x28, batch {CNN_BATCH})", cnn,
               cnn_data(), cnn_floor(), torch_cnn_step, args)
        memory = conv_memory()
        print("  conv peak memory (8 -> 16 channels, 14x14, fp32), over its input: " + ", ".join(
            f"{part} {whole:.1f}x ({beyond:.1f}x beyond what it returns)"
            for part, (whole, beyond) in memory.items()))
        report(f"2-block transformer (d={D_MODEL}, {HEADS} heads, sequence {LENGTH}, batch "
               f"{T_BATCH})", transformer, token_data(), transformer_floor(),
               torch_transformer_step, args)
    if args.only != "small":
        report(f"residual CNN with BatchNorm (conv {LARGE_CNN_CHANNELS}, 3x{LARGE_SIZE}x"
               f"{LARGE_SIZE}, batch {LARGE_CNN_BATCH})", large_cnn, large_cnn_data(),
               large_cnn_floor(), torch_large_cnn_step, args)
        lm = LARGE_LM
        model_args = {key: lm[key] for key in ("d_model", "heads", "length", "vocab", "blocks")}
        report(f"{lm['blocks']}-block transformer LM (d={lm['d_model']}, {lm['heads']} heads, "
               f"sequence {lm['length']}, batch {lm['batch']}, vocabulary {lm['vocab']})",
               lambda seed=0: transformer(seed, **model_args),
               token_data(length=lm["length"], batch=lm["batch"], vocab=lm["vocab"]),
               transformer_floor(**lm), lambda: torch_transformer_step(**lm), args)


def report(title, make_model, data, floor_step, make_torch_step, args) -> None:
    """One model's rows: its float64 floor, torch's eager step, the engine's two steps."""
    floor = _seconds(floor_step, args.repeat, args.budget)
    print(f"{title}: f64 floor {floor * 1e3:.1f} ms")
    try:
        eager = _seconds(make_torch_step(), args.repeat, args.budget)
        print(f"  torch fp32 eager   {eager * 1e3:8.1f} ms")
    except ImportError:
        eager = None
    for policy in ("32-true", "16-mixed"):
        step = engine_step(make_model, data, policy)
        seconds = _seconds(step, args.repeat, args.budget)
        versus = f", {seconds / eager:.1f}x torch" if eager else ""
        print(f"  fpsim {policy:<12} {seconds * 1e3:8.1f} ms  {seconds / floor:.1f}x floor"
              f"{versus}")
        print(f"    {product_paths(step)}")
        print(f"    {sum_paths(step)}")
        print(f"    {correctly_rounded_paths(step)}")
        print(f"    peak memory of one step: {peak_in_a_fresh_thread(step) / 2 ** 20:.1f} MiB")
    if compiled_available():       # what the optional compiled kernels (fpsim[fast]) buy
        previous = use_compiled(False)
        try:
            seconds = _seconds(step, args.repeat, args.budget)
        finally:
            use_compiled(previous)
        print(f"  fpsim 16-mixed, NumPy kernels only (use_compiled(False)) {seconds * 1e3:8.1f}"
              f" ms  {seconds / floor:.1f}x floor")


def sum_paths(step) -> str:
    """How one step's exact row sums ran (``fpsim.exact.sums``): the rows the float64
    certificate decided and those it left to the integer limbs (its fallback)."""
    before = dict(SUM_ROWS)
    step()
    certified, limbs = (SUM_ROWS[key] - before[key] for key in ("certified", "limbs"))
    return f"row sums: {certified} certified, {limbs} by limbs"


def correctly_rounded_paths(step) -> str:
    """How one step's correctly rounded functions ran (``fpsim.exact.correctly_rounded``: GELU,
    softmax, cross-entropy, ...): the elements the float64 certificate decided and those it
    left to the Decimal fallback."""
    before = dict(FALLBACK_COUNT)
    step()
    checked, settled = (FALLBACK_COUNT[key] - before[key] for key in ("checked", "elements"))
    return f"correctly rounded: {checked - settled} certified, {settled} by the Decimal fallback"


def product_paths(step) -> str:
    """How one step's exact products ran: the fast paths' matrix products and the elements
    they left open (to the exact step), the general path's products and limb sums."""
    with count_products() as counts:
        step()
    share = counts.open / max(1, counts.elements)
    return (f"products: {counts.fast} fast ({counts.elements} elements, {counts.open} open "
            f"= {share:.2%}, {counts.exact} summed exactly), {counts.general} general "
            f"({counts.general_exact} of {counts.general_elements} elements by limbs)")

if __name__ == "__main__":
    main()
