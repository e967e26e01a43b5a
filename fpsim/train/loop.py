"""The training loop: every step bit-exact, recorded, and resumable.

One step (``policy`` active throughout)::

    idx    = rng.integers(0, len(data), batch_size)       # the only randomness: seeded
    loss   = cross_entropy(model(Tensor(x[idx])), y[idx])
    backward with seed = scale                          # == (loss * scale).backward() in torch
    report = optimizer.step(scaler_state)               # overflow test, unscale, skip or apply
    trace  <- StepRecord(loss, its bits, scale, found_inf, skipped, grad norm, underflow, lost)

Resuming from a checkpoint taken after step k restores the parameters, the optimizer (master
copies, moments), the scaler's counters and the batch generator's state, so the run continues
with exactly the bits the uninterrupted run had.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._version import __version__ as _fpsim_version
from ..autograd import Tensor, cross_entropy, get_policy, no_grad, use_policy
from ..exact.underflow import count_gradient_underflow
from ..optim import SGD, Optimizer
from ..scaling import NoScaler, ScalerState, StaticScaler, preset
from .checkpoint import load_checkpoint, save_checkpoint
from .data import Dataset
from .recipes import recipe_for, recipe_record, scaler_name
from .trace import StepRecord, TraceWriter, read_trace

__all__ = ["train", "TrainResult", "resolve_scaler", "loss_hash"]

_COUNTERS = ("scale", "growth_tracker", "hysteresis_left", "step", "last_overflow_step",
             "consecutive_skips", "total_skips", "total_overflows", "growths", "backoffs")


def resolve_scaler(spec):
    """A scaler configuration from what users write: None or "none"; a number or
    "static:1024" (static scale); "dynamic" (torch's GradScaler); a preset name ("torch",
    "deepspeed", ...); or a scaler configuration itself."""
    if spec is None:
        return NoScaler()
    if hasattr(spec, "init"):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return StaticScaler(float(spec))
    if not isinstance(spec, str):
        raise TypeError(f"a scaler is None, a number, a name or a scaler configuration, got "
                        f"{type(spec).__name__}")
    text = spec.strip().lower()
    if text == "none":
        return NoScaler()
    if text == "dynamic":
        return preset("torch")
    if text.startswith("static:"):
        try:
            value = float(text.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"static scale {spec!r}: give a number, e.g. 'static:1024'") from None
        return StaticScaler(value)
    try:
        return preset(text)
    except ValueError as err:
        raise ValueError(f"unknown scaler {spec!r}: use 'none', 'dynamic', 'static:N' or a "
                         f"preset ({str(err).split('valid names: ')[-1]})") from None


def loss_hash(losses) -> str:
    """SHA-256 of the float32 bits of a loss series: equal hashes, equal bits."""
    return hashlib.sha256(np.asarray(losses, np.float32).tobytes()).hexdigest()


@dataclass
class TrainResult:
    records: list[StepRecord]
    scaler_state: ScalerState
    optimizer: Optimizer
    out: Path | None = None
    nonfinite_steps: list[int] = field(default_factory=list)

    @property
    def losses(self) -> np.ndarray:
        return np.array([r.loss for r in self.records], np.float32)

    @property
    def loss_hash(self) -> str:
        return loss_hash(self.losses)


def train(model, data: Dataset, *, optimizer: Optimizer | None = None, scaler="recipe",
          policy="16-mixed", steps: int = 100, batch_size: int = 64, seed: int = 0,
          out: "str | os.PathLike | None" = None, trace_layout: str = "jsonl",
          checkpoint_every: int | None = None, resume: "str | os.PathLike | None" = None,
          progress: bool | None = None, config: dict | None = None) -> TrainResult:
    """Train ``model`` (a ``Module`` mapping ``(batch, features)`` to class logits) on
    ``data`` for ``steps`` steps. Everything is checked before the first step: bad input
    raises ``ValueError``/``TypeError`` and nothing is written.

    ``optimizer`` defaults to SGD(lr=0.1) with the master copy the policy's recipe keeps
    (``fpsim.train.recipe_for``: fp32 for the mixed recipes, none for the true ones);
    ``scaler`` takes what ``resolve_scaler`` accepts, or ``"recipe"`` (the default): the
    recipe's scaler (torch's dynamic GradScaler for "16-mixed", none otherwise). ``run.json``
    records the recipe's defaults and what the run changed from them (``recipe``,
    ``overrides``). With ``out``, writes ``run.json``, ``trace.jsonl`` (or ``.csv``), and
    ``checkpoint.npz`` every ``checkpoint_every`` steps and at the end.
    ``resume``: a checkpoint written by an earlier run with the same configuration.
    """
    _check_count("steps", steps, 1)
    _check_count("batch_size", batch_size, 1)
    if checkpoint_every is not None:
        _check_count("checkpoint_every", checkpoint_every, 1)
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be an fpsim.train.Dataset, got {type(data).__name__}")
    if trace_layout not in ("jsonl", "csv"):
        raise ValueError(f"trace_layout must be 'jsonl' or 'csv', got {trace_layout!r}")
    policy = get_policy(policy)
    recipe = recipe_for(policy)
    with use_policy(policy):
        optimizer = (optimizer if optimizer is not None
                     else Optimizer(model, SGD(lr=0.1), master=recipe.master))
    if isinstance(scaler, str) and scaler.strip().lower() == "recipe":
        scaler = recipe.scaler
    scaler_cfg = resolve_scaler(scaler)
    _dry_run(model, data, policy)

    rng = np.random.default_rng(seed)
    state = scaler_cfg.init()
    start = 0
    if resume is not None:
        start, state = _restore(resume, model, optimizer, scaler_cfg, rng)
        if start >= steps:
            raise ValueError(f"checkpoint {resume} is at step {start}; ask for more than "
                             f"{start} steps to continue")

    settings = dict(config or {}, policy=policy.name if hasattr(policy, "name") else str(policy),
                    steps=steps, batch_size=batch_size, seed=seed,
                    optimizer=repr(optimizer.rule),
                    master=str(optimizer.master_fmt) if optimizer.master_fmt else None,
                    clip_norm=optimizer.clip_norm, scaler=repr(scaler_cfg), data=data.name,
                    model=type(model).__name__, scaler_name=scaler_name(scaler_cfg),
                    **recipe_record(recipe, optimizer.master_fmt, scaler_cfg))
    out_dir, writer, kept = _open_outputs(out, trace_layout, settings, start, resume)
    records: list[StepRecord] = list(kept)
    nonfinite: list[int] = [r.step for r in kept if not np.isfinite(r.loss)]
    bar = _progress_bar(steps, start, progress)
    try:
        for step in range(start, steps):
            began = time.perf_counter()
            idx = rng.integers(0, len(data), batch_size)
            with use_policy(policy):
                loss = cross_entropy(model(Tensor(data.x[idx])), data.y[idx])
                scale = state.scale
                with count_gradient_underflow() as counts:
                    loss.backward(np.full(loss.shape, scale, np.float32))
            report = optimizer.step(state)
            optimizer.zero_grad()
            state = report.scaler_state
            value = float(loss.item())
            record = StepRecord(step, value, scale, report.found_inf, report.skipped,
                                report.grad_norm, counts.fraction, report.lost_fraction,
                                time.perf_counter() - began)
            records.append(record)
            if not np.isfinite(value):
                nonfinite.append(step)
            if writer is not None:
                writer.write(record)
            if out_dir is not None and checkpoint_every and (step + 1) % checkpoint_every == 0:
                _save(out_dir / "checkpoint.npz", model, optimizer, state, rng, step + 1)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4g}", scale=f"{scale:g}")
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
    result = TrainResult(records, state, optimizer, out_dir, nonfinite)
    if out_dir is not None:
        _save(out_dir / "checkpoint.npz", model, optimizer, state, rng, steps)
        _finish_run_json(out_dir, result)
    return result


def _check_count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _dry_run(model, data: Dataset, policy) -> None:
    """One forward pass on two samples, so shape and class-count mistakes stop the run before
    anything is written."""
    with use_policy(policy), no_grad():
        logits = model(Tensor(data.x[:2]))
    if logits.ndim != 2 or logits.shape[-1] != data.classes:
        raise ValueError(f"the model maps inputs {data.x[:2].shape} to {logits.shape}, but the "
                         f"data has {data.classes} classes: the output must be "
                         f"(batch, {data.classes})")


def _open_outputs(out, layout, settings, start, resume):
    if out is None:
        return None, None, []
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".fpsim-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"cannot write the output folder {out_dir}: {err.strerror or err}") from None
    trace_path = out_dir / f"trace.{layout}"
    kept = []
    if resume is not None and trace_path.exists():
        kept = [r for r in read_trace(trace_path) if r.step < start]
    info = {"fpsim": _fpsim_version, "python": sys.version.split()[0],
            "numpy": np.__version__, "ml_dtypes": _version_of("ml_dtypes"),
            "platform": platform.platform(), "backend": "numpy", "resumed_at": start,
            "config": settings}
    (out_dir / "run.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    writer = TraceWriter(trace_path, layout)
    for record in kept:
        writer.write(record)
    return out_dir, writer, kept


def _finish_run_json(out_dir: Path, result: TrainResult) -> None:
    path = out_dir / "run.json"
    info = json.loads(path.read_text())
    info["summary"] = {
        "steps": len(result.records), "final_loss": _json_number(result.records[-1].loss),
        "loss_sha256": result.loss_hash, "skipped_steps": sum(r.skipped for r in result.records),
        "nonfinite_loss_steps": result.nonfinite_steps[:100],
        "final_scale": _json_number(result.scaler_state.scale),
    }
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _json_number(value: float):
    return value if np.isfinite(value) else repr(float(value))


def _version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _save(path: Path, model, optimizer: Optimizer, state: ScalerState, rng, step: int) -> None:
    arrays = {f"param/{name}": value for name, value in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    meta = {"step": step, "rng": rng.bit_generator.state,
            "scaler": {name: getattr(state, name) for name in _COUNTERS}}
    save_checkpoint(path, arrays, meta)


def _restore(path, model, optimizer: Optimizer, scaler_cfg, rng):
    arrays, meta = load_checkpoint(path)
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    try:
        model.load_state_dict(params)
    except (KeyError, ValueError) as err:
        raise ValueError(f"checkpoint {path} does not fit this model: {err}") from None
    optimizer.load_state_dict({k[len("optim/"):]: v for k, v in arrays.items()
                               if k.startswith("optim/")})
    rng.bit_generator.state = meta["rng"]
    state = dataclasses.replace(scaler_cfg.init(), **meta["scaler"])
    return int(meta["step"]), state


def _progress_bar(steps: int, start: int, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True, leave=False)
