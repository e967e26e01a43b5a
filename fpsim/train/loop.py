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

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._version import __version__ as _fpsim_version
from ..files import folder_lock, write_text
from ..autograd import Tensor, cross_entropy, get_policy, no_grad, use_policy
from ..exact.underflow import count_gradient_underflow
from ..optim import SGD, Optimizer
from ..scaling import NoScaler, ScalerState, StaticScaler, preset
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .data import Dataset
from .trace import StepRecord, TraceWriter, format_record, read_trace, trace_header

__all__ = ["train", "TrainResult", "resolve_scaler", "loss_hash", "RUN_FILES",
           "ADJUSTABLE_ON_RESUME"]

# What a run folder holds; a folder with any of them holds a run.
RUN_FILES = ("run.json", "trace.jsonl", "trace.csv", "checkpoint.npz")
# Configuration fields a resumed run may change when asked to (``allow_changes``): they steer
# the next updates without changing what the checkpoint's state means.
ADJUSTABLE_ON_RESUME = ("lr", "weight_decay", "clip_norm")

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
    notes: list[str] = field(default_factory=list)   # what was done on the user's behalf

    @property
    def losses(self) -> np.ndarray:
        return np.array([r.loss for r in self.records], np.float32)

    @property
    def loss_hash(self) -> str:
        return loss_hash(self.losses)


def train(model, data: Dataset, *, optimizer: Optimizer | None = None, scaler=None,
          policy="16-mixed", steps: int = 100, batch_size: int = 64, seed: int = 0,
          out: "str | os.PathLike | None" = None, trace_layout: str = "jsonl",
          checkpoint_every: int | None = None, resume: "str | os.PathLike | None" = None,
          progress: bool | None = None, config: dict | None = None, overwrite: bool = False,
          allow_changes=()) -> TrainResult:
    """Train ``model`` (a ``Module`` mapping ``(batch, features)`` to class logits) on
    ``data`` for ``steps`` steps. Everything is checked before the first step: bad input
    raises ``ValueError``/``TypeError`` and nothing is written.

    ``optimizer`` (built for ``model``) defaults to SGD(lr=0.1) with an fp32 master copy;
    ``scaler`` takes what ``resolve_scaler`` accepts. With ``out``, writes ``run.json``,
    ``trace.jsonl`` (or ``.csv``), and ``checkpoint.npz`` every ``checkpoint_every`` steps and
    at the end, holding ``out/.fpsim.lock`` meanwhile (a second writer is refused). A folder
    that already holds a run is refused unless ``resume`` continues it or ``overwrite=True``
    replaces it.

    ``resume``: a checkpoint written by an earlier run with the same configuration (every
    field but ``steps``; ``allow_changes`` may name fields of ``ADJUSTABLE_ON_RESUME`` that
    are allowed to differ). The checkpoint is checked completely first, and the trace in
    ``out`` must hold every step before the checkpoint's; steps after it (and a last line
    torn by a crash) are dropped, as ``TrainResult.notes`` says.
    """
    _check_count("steps", steps, 1)
    _check_count("batch_size", batch_size, 1)
    if checkpoint_every is not None:
        _check_count("checkpoint_every", checkpoint_every, 1)
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be an fpsim.train.Dataset, got {type(data).__name__}")
    if trace_layout not in ("jsonl", "csv"):
        raise ValueError(f"trace_layout must be 'jsonl' or 'csv', got {trace_layout!r}")
    allow_changes = _check_allowed(allow_changes)
    policy = get_policy(policy)
    with use_policy(policy):
        optimizer = optimizer if optimizer is not None else Optimizer(model, SGD(lr=0.1))
    _check_optimizer_fits(model, optimizer)
    scaler_cfg = resolve_scaler(scaler)
    _dry_run(model, data, policy)

    settings = dict(config or {}, policy=policy.name if hasattr(policy, "name") else str(policy),
                    steps=steps, batch_size=batch_size, seed=seed,
                    optimizer=repr(optimizer.rule),
                    master=str(optimizer.master_fmt) if optimizer.master_fmt else None,
                    clip_norm=optimizer.clip_norm, scaler=repr(scaler_cfg), data=data.name,
                    model=type(model).__name__)
    identity = _identity(settings, optimizer, data, model)
    rng = np.random.default_rng(seed)
    state = scaler_cfg.init()
    start = 0
    if resume is not None:
        start, state = _restore(resume, model, optimizer, scaler_cfg, rng, identity,
                                allow_changes)
        if start >= steps:
            raise ValueError(f"checkpoint {resume} is at step {start}; ask for more than "
                             f"{start} steps to continue")
    with contextlib.ExitStack() as stack:
        out_dir, writer, kept, notes = _open_outputs(stack, out, trace_layout, settings, start,
                                                     resume, overwrite)
        result = _run(model, data, optimizer, state, policy, rng, range(start, steps),
                      batch_size, writer, out_dir, checkpoint_every, identity, kept, progress,
                      steps)
        result.notes[:0] = notes
        if out_dir is not None:
            _save(out_dir / "checkpoint.npz", model, optimizer, result.scaler_state, rng, steps,
                  identity)
            _finish_run_json(out_dir, result, settings, start)
    return result


def _run(model, data, optimizer, state, policy, rng, step_range, batch_size, writer, out_dir,
         checkpoint_every, identity, kept, progress, steps) -> TrainResult:
    records: list[StepRecord] = list(kept)
    nonfinite: list[int] = [r.step for r in kept if not np.isfinite(r.loss)]
    bar = _progress_bar(steps, step_range.start, progress)
    try:
        for step in step_range:
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
                _save(out_dir / "checkpoint.npz", model, optimizer, state, rng, step + 1,
                      identity)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4g}", scale=f"{scale:g}")
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
    return TrainResult(records, state, optimizer, out_dir, nonfinite)


def _check_allowed(allow_changes) -> frozenset:
    if isinstance(allow_changes, str):
        allow_changes = [allow_changes]
    allowed = frozenset(allow_changes)
    wrong = sorted(str(name) for name in allowed if name not in ADJUSTABLE_ON_RESUME)
    if wrong:
        raise ValueError(f"allow_changes: {', '.join(wrong)} cannot change on resume (the "
                         f"checkpoint's state depends on it); fields that can: "
                         f"{', '.join(ADJUSTABLE_ON_RESUME)}")
    return allowed


def _check_optimizer_fits(model, optimizer) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be an fpsim.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    own = {id(p) for _, p in model.named_parameters()}
    theirs = {id(p) for _, p in optimizer.named}
    if own != theirs:
        raise ValueError(f"the optimizer was built for another model: it updates "
                         f"{len(theirs - own)} parameter(s) that are not this model's and "
                         f"misses {len(own - theirs)} of its {len(own)}; build it with "
                         f"Optimizer(model, rule)")


def _identity(settings: dict, optimizer: Optimizer, data: Dataset, model) -> dict:
    """The configuration a checkpoint belongs to, field by field (``steps`` aside): what a
    resumed run must match."""
    ident = {k: v for k, v in settings.items() if k not in ("steps", "optimizer", "command")}
    rule = optimizer.rule
    ident["optimizer"] = type(rule).__name__
    if dataclasses.is_dataclass(rule):
        ident.update({f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})
    ident["data_sha256"] = hashlib.sha256(data.x.tobytes() + data.y.tobytes()).hexdigest()
    ident["parameters"] = {name: [str(p.fmt), *map(int, p.shape)]
                           for name, p in model.named_parameters()}
    return json.loads(json.dumps(ident, default=str))   # as it reads back from a checkpoint


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


def _open_outputs(stack: contextlib.ExitStack, out, layout, settings, start, resume,
                  overwrite):
    """Lock ``out``, check what it holds, write ``run.json`` and open the trace; returns
    (folder, trace writer, trace records kept from before ``start``, notes)."""
    if out is None:
        return None, None, [], []
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".fpsim-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"cannot write the output folder {out_dir}: {err.strerror or err}") from None
    taken_over = stack.enter_context(folder_lock(out_dir))
    notes = [taken_over] if taken_over else []
    trace_path = out_dir / f"trace.{layout}"
    present = [name for name in RUN_FILES if (out_dir / name).exists()]
    kept: list[StepRecord] = []
    if resume is None and present and not overwrite:
        raise ValueError(f"{out_dir} already holds a run ({', '.join(present)}); continue it "
                         f"with --resume {out_dir / 'checkpoint.npz'} and more --steps, replace "
                         f"it with --overwrite, or choose another --out")
    if resume is None:
        for name in present:
            (out_dir / name).unlink()
    elif start > 0:
        kept, note = _kept_trace(trace_path, start)
        notes += [note] if note else []
    write_text(out_dir / "run.json", json.dumps(_run_info(settings, start), indent=2,
                                                sort_keys=True) + "\n")
    if resume is not None:
        write_text(trace_path, trace_header(layout) + "".join(format_record(r, layout)
                                                              for r in kept))
    writer = TraceWriter(trace_path, layout, append=resume is not None)
    return out_dir, writer, kept, notes


def _kept_trace(trace_path: Path, start: int) -> tuple[list[StepRecord], str]:
    """The trace's records before ``start`` (the checkpoint's step) and a note on what was
    dropped; refuses a trace that does not hold every one of those steps."""
    if not trace_path.exists():
        raise ValueError(f"cannot resume at step {start}: there is no {trace_path} with steps "
                         f"0..{start - 1}; resume with --out set to the folder that holds the "
                         f"run's trace")
    text = trace_path.read_bytes().decode("utf-8", errors="replace")
    torn = bool(text) and not text.endswith("\n")
    records = read_trace(trace_path, drop_torn_tail=True)
    kept = [r for r in records if r.step < start]
    if [r.step for r in kept] != list(range(start)):
        steps = f"steps {kept[0].step}..{kept[-1].step}" if kept else "no steps"
        raise ValueError(f"cannot resume at step {start}: {trace_path} holds {steps} before it "
                         f"(it must hold 0..{start - 1} in order); the resumed trace would "
                         f"have a gap")
    dropped = len(records) - len(kept)
    parts = ([f"{dropped} step(s) after step {start - 1}"] if dropped else []) + \
        (["a last line torn by an interruption"] if torn else [])
    note = (f"{trace_path}: dropped {' and '.join(parts)}; the trace continues from the "
            f"checkpoint's step {start}") if parts else ""
    return kept, note


def _run_info(settings: dict, start: int) -> dict:
    return {"fpsim": _fpsim_version, "python": sys.version.split()[0],
            "numpy": np.__version__, "ml_dtypes": _version_of("ml_dtypes"),
            "platform": platform.platform(), "backend": "numpy", "resumed_at": start,
            "config": settings}


def _finish_run_json(out_dir: Path, result: TrainResult, settings: dict, start: int) -> None:
    info = _run_info(settings, start)
    info["summary"] = {
        "steps": len(result.records), "final_loss": _json_number(result.records[-1].loss),
        "loss_sha256": result.loss_hash, "skipped_steps": sum(r.skipped for r in result.records),
        "nonfinite_loss_steps": result.nonfinite_steps[:100],
        "final_scale": _json_number(result.scaler_state.scale),
    }
    write_text(out_dir / "run.json", json.dumps(info, indent=2, sort_keys=True) + "\n")


def _json_number(value: float):
    return value if np.isfinite(value) else repr(float(value))


def _version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _save(path: Path, model, optimizer: Optimizer, state: ScalerState, rng, step: int,
          identity: dict) -> None:
    arrays = {f"param/{name}": value for name, value in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    meta = {"step": step, "rng": rng.bit_generator.state, "config": identity,
            "scaler": {name: getattr(state, name) for name in _COUNTERS}}
    save_checkpoint(path, arrays, meta)


_META_KEYS = ("step", "rng", "scaler", "config")


def _restore(path, model, optimizer: Optimizer, scaler_cfg, rng, identity: dict,
             allow_changes: frozenset):
    """Check the checkpoint completely against this run, then load it into ``model``,
    ``optimizer`` and ``rng``; returns (step, scaler state)."""
    arrays, meta = load_checkpoint(path)

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {problem}")

    unknown = sorted(set(meta) - set(_META_KEYS))
    missing = [k for k in _META_KEYS if k not in meta]
    if unknown or missing:
        raise bad(f"metadata has unknown keys {unknown} / lacks {missing}; an fpsim training "
                  f"checkpoint has {', '.join(_META_KEYS)}")
    step = meta["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"step must be a non-negative integer, got {step!r}")
    _check_same_config(path, meta["config"], identity, allow_changes)
    state = _scaler_state(meta["scaler"], scaler_cfg, bad)
    probe = np.random.default_rng()
    try:
        probe.bit_generator.state = meta["rng"]
    except (TypeError, ValueError, KeyError) as err:
        raise bad(f"the batch generator's state does not load ({err})") from None
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    optim = {k[len("optim/"):]: v for k, v in arrays.items() if k.startswith("optim/")}
    strays = [k for k in arrays if not k.startswith(("param/", "optim/"))]
    if strays:
        raise bad(f"unknown arrays {strays[:5]}; a training checkpoint holds param/... and "
                  f"optim/... arrays")
    own = model.state_dict()
    if set(params) != set(own):
        raise bad(f"parameters {sorted(set(own) - set(params))[:5]} missing, "
                  f"{sorted(set(params) - set(own))[:5]} unknown: it does not fit this model")
    for name, value in params.items():
        if value.shape != own[name].shape or value.dtype != own[name].dtype:
            raise bad(f"parameter {name!r} is {value.dtype}{list(value.shape)}, the model's "
                      f"is {own[name].dtype}{list(own[name].shape)}")
    try:
        optimizer.load_state_dict(optim)     # checks every array before it changes anything
    except (KeyError, ValueError, TypeError) as err:
        raise bad(f"optimizer state does not fit: {err}") from None
    model.load_state_dict(params)
    rng.bit_generator.state = meta["rng"]
    return step, state


def _check_same_config(path, saved, identity: dict, allow_changes: frozenset) -> None:
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path}: 'config' must be an object, got {saved!r}")
    differ = [k for k in sorted(set(saved) | set(identity))
              if saved.get(k) != identity.get(k) and k not in allow_changes]
    if differ:
        shown = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {identity.get(k)!r}"
                          for k in differ[:6])
        adjustable = [k for k in differ if k in ADJUSTABLE_ON_RESUME]
        hint = (f" ({', '.join(adjustable)} may change if you say so: --allow-change "
                f"{adjustable[0]})" if adjustable else "")
        raise ValueError(f"cannot resume from {path}: the configuration differs in "
                         f"{', '.join(differ)} ({shown}){hint}; resume with the same settings")


def _scaler_state(saved, scaler_cfg, bad) -> ScalerState:
    if not isinstance(saved, dict) or set(saved) != set(_COUNTERS):
        raise bad(f"scaler state must hold exactly {', '.join(_COUNTERS)}")
    scale = saved["scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
            not (math.isfinite(scale) and scale >= 0):
        # 0 is a state torch's GradScaler reaches (no floor), so it is a state to resume
        raise bad(f"scaler scale must be a finite number >= 0, got {scale!r}")
    for name in _COUNTERS[1:]:
        value, low = saved[name], -1 if name == "last_overflow_step" else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(f"scaler counter {name} must be an integer >= {low}, got {value!r}")
    return dataclasses.replace(scaler_cfg.init(), **saved)


def _progress_bar(steps: int, start: int, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True, leave=False)
