"""One training step of the models issue 26 names, in one run: a small CNN (two 3x3
convolutions, 1x28x28 inputs, batch 64) and a 2-block pre-LN transformer on tokens (d=64,
4 heads, sequence 32, batch 16, ``fpsim.train.models.TokenTransformer``), each under "32-true" and
"16-mixed", beside the float64 floor of the step's products (the exact model cannot be faster
than its float64 products) and PyTorch's float32 eager step of the same model on the CPU.

Target (issue 26): each step within 3x its float64 floor. Also printed: the convolution's
im2col memory, measured with tracemalloc, against the input's size (target: under 4x).

Each time is the fastest of ``--repeat`` rounds of about ``--budget / --repeat`` seconds, the
rows taking turns.

Run: python benchmarks/bench_models.py [--repeat N] [--budget S]
"""
from __future__ import annotations

import argparse
import tracemalloc

import numpy as np

from _timing import seconds_per_call as _seconds

from fpsim import nn
from fpsim.autograd import Tensor, use_policy
from fpsim.exact.sums import SUM_ROWS
from fpsim.exact.correctly_rounded import FALLBACK_COUNT
from fpsim.exact.product_count import count_products
from fpsim.optim import SGD, Optimizer
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
    product, the weight gradient and (above the first layer) the input gradient, and the
    read-out's three products."""
    rng = np.random.default_rng(0)
    shapes = []
    depth, size = 1, 28
    for i, out in enumerate(CNN_CHANNELS):
        rows, inner = batch * size * size, depth * 9
        shapes += [((rows, inner), (inner, out)), ((out, rows), (rows, inner))]
        if i:
            shapes.append(((rows, out), (out, inner)))
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


def transformer(seed=0):
    from fpsim.train.models import TokenTransformer
    return TokenTransformer(VOCAB, VOCAB, LENGTH, d_model=D_MODEL, heads=HEADS, blocks=2,
                            seed=seed)


def token_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (T_BATCH, LENGTH))
    return Dataset(ids, rng.integers(0, VOCAB, (T_BATCH, LENGTH)), VOCAB, "bench")


def transformer_floor():
    """The float64 products of one exact step: each forward product of the two blocks and
    the read-out (projections, scores, weights @ values, the MLP), and two backward products
    of each shape (the gradients of both operands)."""
    rng = np.random.default_rng(0)
    rows, head = T_BATCH * LENGTH, D_MODEL // HEADS
    block = [((rows, D_MODEL), (D_MODEL, 3 * D_MODEL)),
             ((T_BATCH * HEADS, LENGTH, head), (T_BATCH * HEADS, head, LENGTH)),
             ((T_BATCH * HEADS, LENGTH, LENGTH), (T_BATCH * HEADS, LENGTH, head)),
             ((rows, D_MODEL), (D_MODEL, D_MODEL)), ((rows, D_MODEL), (D_MODEL, 4 * D_MODEL)),
             ((rows, 4 * D_MODEL), (4 * D_MODEL, D_MODEL))]
    shapes = block * 2 + [((rows, D_MODEL), (D_MODEL, VOCAB))]
    pairs = [(rng.standard_normal(a), rng.standard_normal(b)) for a, b in shapes]
    return lambda: [a @ b for _ in range(3) for a, b in pairs]


def torch_transformer_step():
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, 0.0, "gelu",
                                               batch_first=True, norm_first=True)
              for _ in range(2)]
    token, position = torch.nn.Embedding(VOCAB, D_MODEL), torch.nn.Embedding(LENGTH, D_MODEL)
    norm, head = torch.nn.LayerNorm(D_MODEL), torch.nn.Linear(D_MODEL, VOCAB)
    modules = torch.nn.ModuleList([*layers, token, position, norm, head])
    opt = torch.optim.SGD(modules.parameters(), lr=LR)
    ids = torch.randint(0, VOCAB, (T_BATCH, LENGTH))
    labels = torch.randint(0, VOCAB, (T_BATCH, LENGTH))
    mask = torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), 1)

    def step():
        opt.zero_grad()
        x = token(ids) + position(torch.arange(LENGTH))
        for layer in layers:
            x = layer(x, src_mask=mask)
        logits = head(norm(x))
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).backward()
        opt.step()

    return step


def conv_memory() -> tuple[float, float]:
    """Peak bytes traced during the second convolution's forward (8 channels in, 16 out, 14x14)
    over its input's bytes: all of it, and beyond the output it must return."""
    x = np.random.default_rng(0).standard_normal((CNN_BATCH, CNN_CHANNELS[0], 14, 14))
    with use_policy("32-true"):
        layer = nn.Conv2d(CNN_CHANNELS[0], CNN_CHANNELS[1], 3, padding=1, rng=0)
        x = Tensor(x.astype(np.float32))
        tracemalloc.start()
        out = layer(x)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    size = 4 * x.size
    return peak / size, (peak - 4 * out.size) / size


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per row")
    args = parser.parse_args(argv)
    report(f"small CNN (conv {CNN_CHANNELS}, 1x28x28, batch {CNN_BATCH})", cnn, cnn_data(),
           cnn_floor(), torch_cnn_step, args)
    whole, beyond = conv_memory()
    print(f"  conv forward peak memory: {whole:.1f}x its input ({beyond:.1f}x beyond the "
          f"output)")
    report(f"2-block transformer (d={D_MODEL}, {HEADS} heads, sequence {LENGTH}, batch "
           f"{T_BATCH})", transformer, token_data(), transformer_floor(),
           torch_transformer_step, args)


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
