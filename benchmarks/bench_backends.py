"""The same work on each backend, in one run: NumPy, torch on the CPU and, where PyTorch sees
a CUDA device, torch:cuda (the GPU rows of the GPU issue). Every backend gives the same bits
(the parity tests prove it); this measures what each costs.

Rows:

- ``round fp16|bf16|e4m3fn``: rounding N float32 values to the format (nearest even), in
  Gelem/s, beside the backend's own copy of the same array (``copy``): "of copy" is the
  rounding's share of the copy bandwidth (the GPU issue asks >= 50%).
- ``step 16-mixed`` / ``step 32-true``: the step ``fpsim.train.train`` runs (forward,
  cross-entropy, backward with loss scale and underflow count, ``Optimizer.step``), the model's
  data already on the backend's device; beside it PyTorch's float32 eager step on the same
  device (TF32 off) and, for the exact accumulation model's floor, the step's float64 products
  alone on that device (``f64 floor``).

Targets: torch on the CPU is recorded, not targeted (per-op overhead: the probe saw 3-4x the
NumPy step on the small MLP); on CUDA, the GPU issue asks the wide MLP's 16-mixed step
(``--wide``: 784-4096-4096-10, batch 1024) within 3x of torch's fp32 eager step and >= 20x
faster than the NumPy step on the same machine.

Each time is the fastest of ``--repeat`` rounds, the backends taking turns round by round
(CUDA rows synchronise before the clock is read).

Run: python benchmarks/bench_backends.py [--wide] [--repeat N] [--budget S] [--elements N]
     [--backends numpy,torch,torch:cuda]
"""
from __future__ import annotations

import argparse

import numpy as np

from _timing import seconds_per_call

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

SMALL = ([64, 256, 256, 10], 128)
WIDE = ([784, 4096, 4096, 10], 1024)
FORMATS = ("fp16", "bf16", "e4m3fn")
LR = 0.01


def _synchronize() -> None:
    if backend.name().startswith("torch:cuda"):
        import torch
        torch.cuda.synchronize()


def _seconds(fn, repeat: int, budget_s: float) -> float:
    return seconds_per_call(fn, repeat, budget_s, _synchronize)


def rounding_work(n: int) -> dict:
    """Rounding to each format and a copy of the same float32 array, on the current backend."""
    x = backend.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32) * 100)
    work = {f"round {fmt}": (lambda fmt=fmt: backend.round_to(x, fmt)) for fmt in FORMATS}
    work["copy"] = lambda: backend.copy(x)
    return work


def step_work(sizes, batch, policy):
    """``fpsim.train.train``'s step on the current backend, the data already there."""
    from fpsim.exact import count_gradient_underflow
    from fpsim.optim import SGD, Optimizer
    from fpsim.train import resolve_scaler

    rng = np.random.default_rng(0)
    with use_policy(policy):
        model = nn.MLP(sizes, rng=1)
        optimizer = Optimizer(model, SGD(lr=LR))
    x = backend.asarray(rng.standard_normal((batch, sizes[0])).astype(np.float32))
    labels = backend.asarray(rng.integers(0, sizes[-1], batch), backend.xp.int64)
    holder = [resolve_scaler("dynamic" if policy == "16-mixed" else None).init()]

    def step():
        state = holder[0]
        with use_policy(policy):
            loss = ag.cross_entropy(model(Tensor(x)), labels)
            with count_gradient_underflow():
                loss.backward(backend.asarray(np.full(loss.shape, state.scale, np.float32)))
        report = optimizer.step(state)
        optimizer.zero_grad()
        holder[0] = report.scaler_state

    return step


def torch_eager_step(sizes, batch, device: str):
    """PyTorch's own float32 step (Linear/ReLU, cross-entropy, SGD) on ``device``, TF32 off."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    layers = []
    for i in range(len(sizes) - 1):
        layers += [torch.nn.Linear(sizes[i], sizes[i + 1])] + ([torch.nn.ReLU()]
                                                              if i < len(sizes) - 2 else [])
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(batch, sizes[0], device=device)
    labels = torch.randint(0, sizes[-1], (batch,), device=device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()

    return step


def float64_floor(sizes, batch):
    """The float64 products of one exact-model step alone, on the current backend."""
    rng = np.random.default_rng(0)
    products = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        x, w = rng.standard_normal((batch, n_in)), rng.standard_normal((n_out, n_in))
        g = rng.standard_normal((batch, n_out))
        pairs = [(x, w.T), (g.T, x)] + ([(g, w)] if i else [])
        products += [(backend.asarray(a, backend.xp.float64),
                      backend.asarray(np.ascontiguousarray(b), backend.xp.float64))
                     for a, b in pairs]
    return lambda: [backend.xp.matmul(a, b) for a, b in products]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wide", action="store_true", help="784-4096-4096-10, batch 1024")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per row")
    parser.add_argument("--elements", type=int, default=1 << 22, help="values rounded")
    parser.add_argument("--backends", default=None,
                        help="comma-separated (default: numpy, torch, and torch:cuda when "
                             "PyTorch sees a CUDA device)")
    args = parser.parse_args(argv)
    names = args.backends.split(",") if args.backends else ["numpy"]
    if not args.backends and "torch" in backend.available():
        import torch
        names += ["torch"] + (["torch:cuda"] if torch.cuda.is_available() else [])
    sizes, batch = WIDE if args.wide else SMALL
    print(f"model {'-'.join(map(str, sizes))}, batch {batch}; {args.elements} values rounded")
    print(f"{'backend':<12} {'row':<16} {'time':>11} {'rate / ratio':>24}")
    steps = {}
    for name in names:
        with backend.use_backend(name):
            device = "cuda" if name.startswith("torch:cuda") else "cpu"
            work = rounding_work(args.elements)
            times = {row: _seconds(fn, args.repeat, args.budget) for row, fn in work.items()}
            for row, seconds in times.items():
                share = "" if row == "copy" else f", {times['copy'] / seconds:.0%} of copy"
                print(f"{name:<12} {row:<16} {seconds * 1e3:9.3f} ms "
                      f"{args.elements / seconds / 1e9:8.2f} Gelem/s{share}")
            for policy in ("16-mixed", "32-true"):
                steps[name, policy] = _seconds(step_work(sizes, batch, policy), args.repeat,
                                               args.budget)
            floor = _seconds(float64_floor(sizes, batch), args.repeat, args.budget)
            eager = None
            if "torch" in backend.available():
                eager = _seconds(torch_eager_step(sizes, batch, device), args.repeat,
                                 args.budget)
            for policy in ("16-mixed", "32-true"):
                seconds = steps[name, policy]
                against = [f"{seconds / floor:.1f}x f64 floor"]
                if eager:
                    against.append(f"{seconds / eager:.1f}x torch fp32 eager")
                if (("numpy", policy) in steps) and name != "numpy":
                    against.append(f"{steps['numpy', policy] / seconds:.2f}x numpy's speed")
                print(f"{name:<12} {'step ' + policy:<16} {seconds * 1e3:9.3f} ms  "
                      + ", ".join(against))
            print(f"{name:<12} {'f64 floor':<16} {floor * 1e3:9.3f} ms")
            if eager:
                print(f"{name:<12} {'torch eager':<16} {eager * 1e3:9.3f} ms  ({device}, fp32)")


if __name__ == "__main__":
    main()
