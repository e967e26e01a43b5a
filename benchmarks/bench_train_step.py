"""Training-step speed of the engine: an MLP step (forward, cross-entropy, backward, plain SGD
update) under "32-true" and "16-mixed", beside PyTorch's CPU float32 eager step when torch is
installed, all measured in one run and printed as ratios.

Targets (issue 3): "16-mixed" costs at most 2x the engine's own "32-true" step; on the small
model, the engine's "16-mixed" step is no slower than PyTorch's float32 step. The "f64 floor"
column times the float64 BLAS products of one exact-model step alone (no engine step can be
faster); "torch/floor" at or below 1 means the second target is out of reach of the exact
model on this machine.

Each configuration's time is the fastest of ``--repeat`` rounds, the configurations taking
turns, so that a shared, loaded machine disturbs them alike (the minimum is the least
disturbed).

``--threads N`` runs both NumPy's BLAS and PyTorch on N threads (default: their own
defaults); on a shared, busy machine ``--threads 1`` gives the steadiest comparison, as idle
BLAS threads spin while other processes hold the cores. ``--cpu-time`` times with the
process's CPU time (all its threads) instead of the wall clock: on a machine with more
runnable processes than cores, wall times mostly measure the waiting.

The "whole step" table times the step ``fpsim.train.train`` runs (``whole_step``); targets
(issue 10): at most 3x the f64 floor on the small model, 1.5x on the large one. For a
before/after comparison, run this script from two worktrees in turns (A, B, A, B) with
``--threads 1`` and compare the best of each.

Run: python benchmarks/bench_train_step.py [--repeat N] [--budget S] [--quick] [--threads N]
     [--cpu-time]
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _threads_from_argv(argv) -> int | None:
    """--threads must act before NumPy loads its BLAS, so it is read here, ahead of argparse."""
    for i, arg in enumerate(argv):
        if arg.startswith("--threads"):
            value = arg.partition("=")[2] or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() and int(value) > 0 else None
    return None


_THREADS = _threads_from_argv(sys.argv[1:]) if __name__ == "__main__" else None
if _THREADS:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(_THREADS)

import numpy as np  # noqa: E402  (after the thread settings)

import fpsim.autograd as ag  # noqa: E402
from fpsim import nn  # noqa: E402
from fpsim.autograd import Tensor, use_policy  # noqa: E402
from fpsim.autograd.numerics import round_array  # noqa: E402

_clock = time.perf_counter       # --cpu-time: time.process_time

MODELS = [("64-256-256-10", [64, 256, 256, 10], 128),
          ("784-1024-1024-10", [784, 1024, 1024, 10], 256)]
LR = 0.01


def _calibrate(step, budget_s: float) -> int:
    """Steps per round so that one round takes about ``budget_s`` (after two warm-up steps)."""
    step()
    step()
    start = _clock()
    step()
    return max(1, int(budget_s / max(_clock() - start, 1e-6)))


def _time_interleaved(steps: dict, repeat: int, budget_s: float) -> dict:
    """Seconds per step of each configuration: the fastest of ``repeat`` rounds, the
    configurations taking turns round by round, so that load from other processes on a shared
    machine hits them alike and the minimum filters it out."""
    counts = {name: _calibrate(step, budget_s / repeat) for name, step in steps.items()}
    best = {name: float("inf") for name in steps}
    for _ in range(repeat):
        for name, step in steps.items():
            start = _clock()
            for _ in range(counts[name]):
                step()
            best[name] = min(best[name], (_clock() - start) / counts[name])
    return best


def engine_step(sizes, batch, policy):
    rng = np.random.default_rng(0)
    with use_policy(policy):
        model = nn.MLP(sizes, rng=1)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    params = model.parameters()

    def step():
        model.zero_grad()
        with use_policy(policy):
            loss = ag.cross_entropy(model(Tensor(x)), labels)
            loss.backward()
        for p in params:
            p.data = round_array(p.data - np.float32(LR) * p.grad.data, p.fmt)

    return step


def whole_step(sizes, batch, policy):
    """The step ``fpsim.train.train`` runs, as a user gets it: forward, cross-entropy, the
    backward pass seeded with the loss scale under the underflow counter, ``Optimizer.step``
    (overflow check, scaler update, unscale, global gradient norm, master-weight SGD update,
    lost-update count) and ``zero_grad``. "16-mixed" runs with the dynamic scaler (what a mixed
    run asks for), "32-true" without a scaler."""
    from fpsim.exact import count_gradient_underflow
    from fpsim.optim import SGD, Optimizer
    from fpsim.train import resolve_scaler

    rng = np.random.default_rng(0)
    with use_policy(policy):
        model = nn.MLP(sizes, rng=1)
        optimizer = Optimizer(model, SGD(lr=LR))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    holder = [resolve_scaler("dynamic" if policy == "16-mixed" else None).init()]

    def step():
        state = holder[0]
        with use_policy(policy):
            loss = ag.cross_entropy(model(Tensor(x)), labels)
            with count_gradient_underflow():
                loss.backward(np.full(loss.shape, state.scale, np.float32))
        report = optimizer.step(state)
        optimizer.zero_grad()
        holder[0] = report.scaler_state
        float(loss.item())

    return step


def float64_floor_step(sizes, batch):
    """The float64 BLAS products alone that one exact-model step needs: per layer the forward
    x @ W.T, the weight gradient g.T @ x and (above the first layer) the input gradient g @ W,
    on float64 operands of the step's shapes. No engine step under the exact accumulation
    model can be faster than this (``fpsim.exact.fast_matmul``: a float32 product cannot
    be certified to the fp32 accumulator's bits), so it shows what the torch target asks."""
    rng = np.random.default_rng(0)
    products = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        x = rng.standard_normal((batch, n_in))
        w = rng.standard_normal((n_out, n_in))
        g = rng.standard_normal((batch, n_out))
        products += [(x, w.T), (g.T, x)] + ([(g, w)] if i else [])

    def step():
        for a, b in products:
            np.matmul(a, b)

    return step


def torch_step(sizes, batch):
    import torch

    torch.manual_seed(0)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(batch, sizes[0])
    labels = torch.randint(0, sizes[-1], (batch,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()

    return step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--budget", type=float, default=3.0,
                        help="seconds per configuration and model, over all rounds")
    parser.add_argument("--quick", action="store_true", help="small model only")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS and torch threads (set before NumPy loads, see the doc)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time, not the wall clock")
    args = parser.parse_args(argv)
    global _clock
    _clock = time.process_time if args.cpu_time else time.perf_counter
    try:
        import torch
        torch_version = torch.__version__
        if args.threads:
            torch.set_num_threads(args.threads)
    except ImportError:
        torch_version = None
    if args.threads and args.threads != _THREADS:
        print(f"note: --threads {args.threads} came too late for NumPy's BLAS "
              f"(run the script itself); BLAS threads unchanged")
    print(f"numpy {np.__version__}, torch {torch_version or 'not installed'}"
          + (f" ({torch.get_num_threads()} threads)" if torch_version else "")
          + (", CPU time" if args.cpu_time else ", wall clock"))
    header = (f"{'model':>18} {'batch':>5} | {'32-true ms':>10} {'16-mixed ms':>11} "
              f"{'torch fp32 ms':>13} {'f64 floor ms':>12} | {'mixed/32':>8} "
              f"{'mixed/torch':>11} {'torch/floor':>11}")
    print(header)
    print("-" * len(header))
    whole_rows = []
    for label, sizes, batch in MODELS[:1] if args.quick else MODELS:
        steps = {"32-true": engine_step(sizes, batch, "32-true"),
                 "16-mixed": engine_step(sizes, batch, "16-mixed"),
                 "whole 32-true": whole_step(sizes, batch, "32-true"),
                 "whole 16-mixed": whole_step(sizes, batch, "16-mixed"),
                 "floor": float64_floor_step(sizes, batch)}
        if torch_version:
            steps["torch"] = torch_step(sizes, batch)
        best = _time_interleaved(steps, args.repeat, args.budget)
        t32, t16, tt, floor = best["32-true"], best["16-mixed"], best.get("torch"), best["floor"]
        ratio_t = f"{t16 / tt:11.2f}" if tt else f"{'-':>11}"
        ratio_f = f"{tt / floor:11.2f}" if tt else f"{'-':>11}"
        tt_ms = f"{tt * 1e3:13.3f}" if tt else f"{'-':>13}"
        print(f"{label:>18} {batch:>5} | {t32 * 1e3:10.3f} {t16 * 1e3:11.3f} {tt_ms} "
              f"{floor * 1e3:12.3f} | {t16 / t32:8.2f} {ratio_t} {ratio_f}")
        w32, w16 = best["whole 32-true"], best["whole 16-mixed"]
        whole_rows.append(f"{label:>18} {batch:>5} | {w32 * 1e3:13.3f} {w16 * 1e3:14.3f} "
                          f"{floor * 1e3:12.3f} | {w32 / floor:10.2f} {w16 / floor:11.2f}")
    whole = (f"{'model':>18} {'batch':>5} | {'whole 32 ms':>13} {'whole mixed ms':>14} "
             f"{'f64 floor ms':>12} | {'w32/floor':>10} {'wmix/floor':>11}")
    print("\nwhole step (trainer's step: scaler, Optimizer.step with norm and master update)")
    print(whole)
    print("-" * len(whole))
    print("\n".join(whole_rows))
    print("targets: mixed/32 <= 2.0 on both models; mixed/torch <= 1.0 on the small model; "
          "whole step\n  w32/floor and wmix/floor <= 3 on the small model, <= 1.5 on the large")
    print("f64 floor: the float64 BLAS products alone of one exact-model step; where "
          "torch/floor <= 1,\n  torch's whole step is no slower than that floor and the "
          "mixed/torch target cannot be met with exact accumulation")


if __name__ == "__main__":
    main()
