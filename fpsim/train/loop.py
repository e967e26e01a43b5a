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
import hashlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend
from ..options import check_choice, check_count, check_flag, check_instance, check_path
from ..backend import xp

from .._version import __version__ as _fpsim_version
from ..files import folder_lock, write_text
from ..autograd import Tensor, get_policy, no_grad, use_policy
from ..exact.underflow import UnderflowCount, count_gradient_underflow, count_per_tensor
from ..nn import Module
from ..optim import SGD, Optimizer
from ..scaling import NoScaler, ScalerState, StaticScaler, preset
from .data import Dataset
from .fp8_stats import FP8_TABLE, collect as collect_fp8, tensor_names
from .layer_stats import LAYERS, LayerStats, open_step_table
from .losses import batch_inputs, resolve_loss
from .run_folder import replacing_run, tidy_run_folder
from .resume import (ADJUSTABLE_ON_RESUME, check_allowed_changes, check_same_config,
                     restore_checkpoint, run_identity, save_training_checkpoint)
from .progress import progress_bar
from .quantized import KeptLayers, seed_stochastic_rounding
from .recipes import recipe_for, recipe_record, scaler_name
from .trace import StepRecord, TraceWriter, format_record, read_trace, trace_header

__all__ = ["train", "TrainResult", "resolve_scaler", "loss_hash", "RUN_FILES",
           "ADJUSTABLE_ON_RESUME"]

# What a run folder holds; a folder with any of them holds a run.
RUN_FILES = ("run.json", "trace.jsonl", "trace.csv", "checkpoint.npz", LAYERS.file, FP8_TABLE.file)


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
    return hashlib.sha256(backend.host_bytes(xp.asarray(losses, xp.float32))).hexdigest()


@dataclass
class TrainResult:
    records: list[StepRecord]
    scaler_state: ScalerState
    optimizer: Optimizer
    out: Path | None = None
    nonfinite_steps: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what was done on the user's behalf
    layer_names: tuple = ()                           # per_layer: the parameters, in order
    layers: list = field(default_factory=list)        # per_layer: a LayerStats per step
    fp8_names: tuple = ()                             # FP8 recipe: the quantized tensors
    fp8: list = field(default_factory=list)           # FP8 recipe: an Fp8Stats per step

    @property
    def losses(self):
        """The per-step losses as a host NumPy float32 array (records live on the host)."""
        return backend.to_numpy(xp.array([r.loss for r in self.records], xp.float32))

    @property
    def loss_hash(self) -> str:
        return loss_hash(self.losses)


def train(model, data: Dataset, *, optimizer: Optimizer | None = None, scaler="recipe",
          policy="16-mixed", steps: int = 100, batch_size: int = 64, seed: int = 0,
          out: "str | os.PathLike | None" = None, trace_layout: str = "jsonl",
          checkpoint_every: int | None = None, resume: "str | os.PathLike | None" = None,
          progress: bool | None = None, config: dict | None = None, overwrite: bool = False,
          allow_changes=(), loss="auto", per_layer: bool = False) -> TrainResult:
    """Train ``model`` (any ``Module``) on ``data`` (a ``Dataset`` of any shape) for ``steps``
    steps. Everything is checked before the first step (one forward pass and loss on two
    samples included): bad input raises ``ValueError``/``TypeError`` and nothing is written.

    ``loss``: ``"cross_entropy"`` (class logits ``(batch, ..., classes)`` against labels
    ``(batch, ...)``: per-token labels are averaged over every position), ``"mse"``, a
    function ``loss(output, targets)`` of the model's output and the batch's targets (a
    ``Tensor`` for regression targets, an integer array for labels) returning a scalar
    ``Tensor``, or ``"auto"`` (the default): cross-entropy for labelled data, mse for
    regression targets. Integer inputs (token ids) reach the model as an integer array, float
    inputs as a ``Tensor`` in the policy's input format.

    Each step draws ``batch_size`` samples with replacement (seeded); a ``batch_size`` above
    ``len(data)`` is refused (PyTorch's DataLoader would give one batch of all samples; here
    it would only repeat samples). ``data`` is checked again (``Dataset.check``): its arrays
    may have been written into after it was built. The model's parameters must be in the
    policy's ``param`` format: build the model under ``use_policy(policy)``.

    ``per_layer``: also record, per parameter and step, the fraction of its gradient values
    that underflowed, of its updates that were lost, and its gradient's largest magnitude
    (``TrainResult.layers``; ``layers.jsonl`` with ``out``; ``fpsim.train.layer_stats``).

    ``optimizer`` (built for ``model``) defaults to SGD(lr=0.1) with the master copy the
    policy's recipe keeps (``fpsim.train.recipe_for``: fp32 for the mixed recipes, none for the
    true ones); ``scaler`` takes what ``resolve_scaler`` accepts, or ``"recipe"`` (the default):
    the recipe's scaler (torch's dynamic GradScaler for "16-mixed", none otherwise).
    ``run.json`` records the recipe's defaults and what the run changed from them (``recipe``,
    ``overrides``). With ``out``, writes ``run.json``,
    ``trace.jsonl`` (or ``.csv``), and ``checkpoint.npz`` every ``checkpoint_every`` steps and
    at the end, holding ``out/.fpsim.lock`` meanwhile (a second writer is refused). A folder
    that already holds a run is refused unless ``resume`` continues it or ``overwrite=True``
    replaces it; the old run is kept until the new one is complete (``run_folder``).

    ``resume``: a checkpoint written by an earlier run with the same configuration (every
    field but ``steps``; ``allow_changes`` may name fields of ``ADJUSTABLE_ON_RESUME`` that
    are allowed to differ). The checkpoint is checked completely first, and the trace in
    ``out`` must hold every step before the checkpoint's; steps after it (and a last line
    torn by a crash) are dropped, as ``TrainResult.notes`` says.
    """
    check_instance("model", model, Module, "an fpsim.nn.Module (e.g. nn.MLP([16, 32, 4]))")
    seed = check_count("seed", seed, 0)
    for name, path in (("out", out), ("resume", resume)):
        if path is not None:
            check_path(name, path)
    check_flag("per_layer", per_layer)
    if progress is not None:
        check_flag("progress", progress)
    check_count("steps", steps, 1)
    check_count("batch_size", batch_size, 1)
    if checkpoint_every is not None:
        check_count("checkpoint_every", checkpoint_every, 1)
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be an fpsim.train.Dataset, got {type(data).__name__}")
    data.check()         # its arrays may have been written into since it was built
    if batch_size > len(data):
        raise ValueError(f"batch_size must be at most the {len(data)} samples of data "
                         f"{data.name!r} (batches are drawn from them with replacement), got "
                         f"{batch_size}")
    check_choice("trace_layout", trace_layout, ("jsonl", "csv"))
    allow_changes = check_allowed_changes(allow_changes)
    policy = get_policy(policy)
    _check_parameter_formats(model, policy)
    recipe = recipe_for(policy)
    with use_policy(policy):
        optimizer = (optimizer if optimizer is not None
                     else Optimizer(model, SGD(lr=0.1), master=recipe.master))
    _check_optimizer_fits(model, optimizer)
    if isinstance(scaler, str) and scaler.strip().lower() == "recipe":
        scaler = recipe.scaler
    scaler_cfg = resolve_scaler(scaler)
    loss_fn, loss_name = resolve_loss(loss, data)
    kept_layers = KeptLayers(model, policy.fp8)      # a recipe's keep=: names checked now
    with kept_layers:
        _dry_run(model, data, policy, loss_fn)
    kept_layers.check_they_run_gemms()
    seed_stochastic_rounding(model, seed)

    settings = dict(config or {}, policy=policy.name if hasattr(policy, "name") else str(policy),
                    steps=steps, batch_size=batch_size, seed=seed,
                    optimizer=repr(optimizer.rule),
                    master=str(optimizer.master_fmt) if optimizer.master_fmt else None,
                    clip_norm=optimizer.clip_norm, scaler=repr(scaler_cfg), data=data.name,
                    model=type(model).__name__, scaler_name=scaler_name(scaler_cfg),
                    loss=loss_name, per_layer=bool(per_layer),
                    **recipe_record(recipe, optimizer.master_fmt, scaler_cfg))
    if policy.fp8 is not None:
        settings["fp8"] = policy.fp8.record()
    identity = run_identity(settings, optimizer, data, model)
    rng = backend.host_rng(seed)
    state = scaler_cfg.init()
    start = 0
    if resume is not None:
        start, state = restore_checkpoint(resume, model, optimizer, scaler_cfg, rng, identity,
                                allow_changes)
        if start >= steps:
            raise ValueError(f"checkpoint {resume} is at step {start}; ask for more than "
                             f"{start} steps to continue")
    with contextlib.ExitStack() as stack:
        stack.enter_context(kept_layers)
        out_dir, writer, kept, notes = _open_outputs(stack, out, trace_layout, settings, start,
                                                     resume, overwrite, identity, allow_changes)
        layers = fp8 = None
        if per_layer:
            names = tuple(name for name, _ in optimizer.named)
            layers = (names, *open_step_table(stack, LAYERS, out_dir, names, start))
        if policy.fp8 is not None:       # the dry run has met every GEMM
            names = tensor_names(model, policy.fp8)
            fp8 = (names, *open_step_table(stack, FP8_TABLE, out_dir, names, start))
        result = _run(model, data, optimizer, state, policy, rng, range(start, steps),
                      batch_size, writer, out_dir, checkpoint_every, identity, kept, progress,
                      steps, loss_fn, layers, fp8)
        result.notes[:0] = notes
        result.out = None if out is None else Path(out)     # not the folder it was built in
        if out_dir is not None:
            save_training_checkpoint(out_dir / "checkpoint.npz", model, optimizer,
                                     result.scaler_state, rng, steps, identity)
            _finish_run_json(out_dir, result, settings, start, identity)
    return result


def _run(model, data, optimizer, state, policy, rng, step_range, batch_size, writer, out_dir,
         checkpoint_every, identity, kept, progress, steps, loss_fn, layers, fp8) -> TrainResult:
    records: list[StepRecord] = list(kept)
    names, layer_writer, layer_stats = layers or ((), None, [])
    fp8_names, fp8_writer, fp8_stats = fp8 or ((), None, [])
    nonfinite: list[int] = [r.step for r in kept if not xp.isfinite(r.loss)]
    bar = progress_bar(steps, step_range.start, "step", progress)
    try:
        for step in step_range:
            began = time.perf_counter()
            idx = rng.integers(0, len(data), batch_size)
            with use_policy(policy):
                loss = loss_fn(model(batch_inputs(data.x[idx])), data.y[idx])
                scale = state.scale
                with count_gradient_underflow() as counts, \
                        (count_per_tensor() if layers else contextlib.nullcontext()) as charged:
                    loss.backward(xp.full(loss.shape, scale, xp.float32))
            gradients = _gradient_statistics(optimizer, charged) if layers else None
            report = optimizer.step(state, per_parameter=bool(layers))
            optimizer.zero_grad()
            state = report.scaler_state
            value = float(loss.item())
            record = StepRecord(step, value, scale, report.found_inf, report.skipped,
                                report.grad_norm, counts.fraction, report.lost_fraction,
                                time.perf_counter() - began)
            records.append(record)
            if layers:
                stats = LayerStats(step, *gradients[:1], _lost_fractions(report, len(names)),
                                   *gradients[1:])
                layer_stats.append(stats)
                if layer_writer is not None:
                    layer_writer.write(stats)
            if fp8:
                fp8_stats.append(collect_fp8(model, fp8_names, step))
                if fp8_writer is not None:
                    fp8_writer.write(fp8_stats[-1])
            if not xp.isfinite(value):
                nonfinite.append(step)
            if writer is not None:
                writer.write(record)
            if out_dir is not None and checkpoint_every and (step + 1) % checkpoint_every == 0:
                save_training_checkpoint(out_dir / "checkpoint.npz", model, optimizer, state,
                                         rng, step + 1, identity)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4g}", scale=f"{scale:g}")
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        for table_writer in (layer_writer, fp8_writer):
            if table_writer is not None:
                table_writer.close()
    return TrainResult(records, state, optimizer, out_dir, nonfinite, layer_names=names,
                       layers=layer_stats, fp8_names=fp8_names, fp8=fp8_stats)


def _gradient_statistics(optimizer, charged: dict) -> tuple:
    """(underflow fraction, largest gradient magnitude) per parameter after backward: nan
    where a rounding was not matched to the parameter's gradient; 0 without a gradient."""
    underflow, largest = [], []
    for _, p in optimizer.named:
        counts = charged.get(id(p), UnderflowCount())
        underflow.append(math.nan if counts is None else counts.fraction)
        has = p.grad is not None and backend.size(p.grad.data) > 0
        largest.append(float(xp.max(xp.abs(p.grad.data))) if has else 0.0)
    return tuple(underflow), tuple(largest)


def _lost_fractions(report, count: int) -> tuple:
    if not report.lost_by_parameter:            # a skipped step moved nothing
        return (0.0,) * count
    return tuple(lost / moved if moved else 0.0 for moved, lost in report.lost_by_parameter)


def _check_parameter_formats(model, policy) -> None:
    """Each parameter carries the format it was built in; the policy computes as if it held
    the policy's ``param`` format, and nothing converts them."""
    for name, p in model.named_parameters():
        if p.fmt != policy.param:
            raise ValueError(f"model parameter {name!r} is stored in {p.fmt} but policy "
                             f"{policy.name} keeps parameters in {policy.param}; build the "
                             f"model under use_policy({policy.name!r}) (as fpsim train does), "
                             f"or train it under a policy whose parameters are {p.fmt}")


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


def _dry_run(model, data: Dataset, policy, loss_fn) -> None:
    """One forward pass and loss on two samples, so shape and class-count mistakes stop the
    run before anything is written."""
    modes = model.training_modes()
    model.eval()       # batch norm's running statistics and dropout's offsets stay as they are
    try:
        with use_policy(policy), no_grad():
            value = loss_fn(model(batch_inputs(data.x[:2])), data.y[:2])
    finally:
        model.restore_modes(modes)
    if not isinstance(value, Tensor) or backend.size(value.data) != 1:
        raise TypeError(f"the loss must give one number (a Tensor of one element), got "
                        f"{getattr(value, 'shape', type(value).__name__)}")


def _open_outputs(stack: contextlib.ExitStack, out, layout, settings, start, resume,
                  overwrite, identity, allow_changes):
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
        raise ValueError(f"cannot write the output folder {out_dir}: "
                         f"{err.strerror or err}") from None
    taken_over = stack.enter_context(folder_lock(out_dir))
    notes = ([taken_over] if taken_over else []) + tidy_run_folder(out_dir)
    trace_path = out_dir / f"trace.{layout}"
    present = [name for name in RUN_FILES if (out_dir / name).exists()]
    kept: list[StepRecord] = []
    if resume is None and present and not overwrite:
        resume_hint = (f"continue it with --resume {out_dir / 'checkpoint.npz'} and more "
                       f"--steps, " if "checkpoint.npz" in present else "")
        raise ValueError(f"{out_dir} already holds a run ({', '.join(present)}); {resume_hint}"
                         f"replace it with --overwrite (overwrite=True), or choose another "
                         f"--out")
    if resume is None and present:      # overwrite: the old run stays until the new is whole
        out_dir = stack.enter_context(replacing_run(out_dir, present))
        trace_path = out_dir / f"trace.{layout}"
    elif resume is not None:
        _check_folder_run(out_dir, identity, allow_changes)
        if start > 0:
            kept, note = _kept_trace(trace_path, start)
            notes += [note] if note else []
    write_text(out_dir / "run.json", json.dumps(_run_info(settings, start, identity), indent=2,
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
    if len(kept) < start:     # read_trace refused gaps, repeats and disorder: it stops short
        first = len(kept)
        missing = f"step {first} is" if first == start - 1 else f"steps {first}..{start - 1} are"
        raise ValueError(f"cannot resume at step {start}: {trace_path} "
                         f"{'holds no steps' if not kept else f'ends at step {first - 1}'}, so "
                         f"{missing} missing; the resumed trace would have a gap (resume from "
                         f"a checkpoint at or before step {first}, or from the start)")
    dropped = len(records) - len(kept)
    parts = ([f"{dropped} step(s) after step {start - 1}"] if dropped else []) + \
        (["a last line torn by an interruption"] if torn else [])
    note = (f"{trace_path}: dropped {' and '.join(parts)}; the trace continues from the "
            f"checkpoint's step {start}") if parts else ""
    return kept, note


def _check_folder_run(out_dir: Path, identity: dict, allow_changes: frozenset) -> None:
    """The trace a resume continues must be this run's: ``run.json``'s configuration must
    match, as the checkpoint's does."""
    path = out_dir / "run.json"
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["identity"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as err:
        raise ValueError(f"cannot resume into {out_dir}: {path} does not say which run its trace "
                         f"belongs to ({type(err).__name__}: {err}); resume into the folder of "
                         f"the checkpoint's run") from None
    check_same_config(f"{path} (the run whose trace would continue)", recorded, identity,
                      allow_changes)


def _run_info(settings: dict, start: int, identity: dict) -> dict:
    return {"fpsim": _fpsim_version, "python": sys.version.split()[0],
            **backend.versions(), "ml_dtypes": _version_of("ml_dtypes"),
            "platform": platform.platform(), "backend": backend.name(), "resumed_at": start,
            "config": settings, "identity": identity}


def _finish_run_json(out_dir: Path, result: TrainResult, settings: dict, start: int,
                     identity: dict) -> None:
    info = _run_info(settings, start, identity)
    info["summary"] = {
        "steps": len(result.records), "final_loss": _json_number(result.records[-1].loss),
        "loss_sha256": result.loss_hash, "skipped_steps": sum(r.skipped for r in result.records),
        "nonfinite_loss_steps": result.nonfinite_steps[:100],
        "final_scale": _json_number(result.scaler_state.scale),
    }
    write_text(out_dir / "run.json", json.dumps(info, indent=2, sort_keys=True) + "\n")


def _json_number(value: float):
    return value if xp.isfinite(value) else repr(float(value))


def _version_of(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
