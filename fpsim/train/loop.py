"""The training loop: every step bit-exact, recorded, and resumable.

One step (``policy`` active throughout), with ``accumulate`` micro-batches (1 by default)::

    for each of the accumulate micro-batches:
        idx  = rng.integers(0, len(data), batch_size)     # the only randomness: seeded
        loss = cross_entropy(model(Tensor(x[idx])), y[idx]) / accumulate   # no division at 1
        backward with seed = scale                        # == (loss * scale).backward()
    report = optimizer.step(scaler_state)                 # overflow test, unscale, skip or apply
    trace  <- StepRecord(loss, its bits, scale, found_inf, skipped, grad norm, underflow, lost)

Gradients of the micro-batches add up in each parameter's gradient format, as ``.grad``
accumulates in torch; the step's loss is the sum of the divided micro-batch losses, added in
float64 and rounded to float32 once (``running += loss.item()``). Resuming from a checkpoint
taken after step k restores the parameters, the optimizer (master copies, moments), the
scaler's counters and the batch generator's state, so the run continues with exactly the bits
the uninterrupted run had.

``train_model`` runs in stages: ``_prepare`` (every check; nothing is written before it
passes), the run's identity, the resume, ``open_outputs``, ``_steps`` (the loop) and the
final checkpoint and ``run.json``.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend
from ..autograd import Tensor, get_policy, no_grad, use_policy
from ..backend import xp
from ..exact.underflow import UnderflowCount, count_gradient_underflow, count_per_tensor
from ..nn import Module
from ..optim import SGD, Optimizer
from ..optim.schedules import Schedule, parse_schedule
from ..options import check_flag, check_instance
from ..scaling import ScalerState, get_scaler
from .config import check_field
from .data import Dataset
from .fp8_stats import FP8_TABLE, collect as collect_fp8, tensor_names
from .layer_stats import LAYERS, LayerStats, open_step_table
from .losses import batch_inputs, resolve_loss
from .outputs import RUN_FILES, Outputs, finish_run_json, open_outputs
from .progress import progress_bar
from .quantized import KeptLayers, seed_stochastic_rounding
from .recipes import recipe_for, recipe_record, scaler_name
from .resume import (ADJUSTABLE_ON_RESUME, restore_checkpoint, run_identity,
                     save_training_checkpoint)
from .trace import StepRecord

__all__ = ["train_model", "TrainResult", "resolve_scaler", "loss_hash", "RUN_FILES",
           "ADJUSTABLE_ON_RESUME"]

# Kept for code written against earlier versions: the scaler grammar lives in fpsim.scaling.
resolve_scaler = get_scaler


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


@dataclass(frozen=True)
class _Run:
    """A checked run: what the loop needs, every option resolved."""

    model: Module
    data: Dataset
    optimizer: Optimizer
    policy: object
    scaler: object
    loss_fn: object
    kept_layers: KeptLayers
    steps: int
    batch_size: int
    accumulate: int
    per_layer: bool
    lrs: list | None         # the schedule's lr of every step (None: the rule's, constant)
    settings: dict


def train_model(model, data: Dataset, *, optimizer: Optimizer | None = None, scaler="recipe",
                policy="16-mixed", steps: int = 100, batch_size: int = 64, seed: int = 0,
                out: "str | os.PathLike | None" = None, trace_layout: str = "jsonl",
                checkpoint_every: int | None = None, resume: "str | os.PathLike | None" = None,
                progress: bool | None = None, overwrite: bool = False, allow_changes=(),
                loss="auto", per_layer: bool = False, accumulate: int = 1, schedule=None,
                recorded: dict | None = None) -> TrainResult:
    """``fpsim.train.train(model, data, ...)``: see its docstring. ``recorded``: entries for
    ``run.json``'s configuration besides the run's own (``TrainConfig.record()``)."""
    for name, value in (("seed", seed), ("steps", steps), ("batch_size", batch_size),
                        ("accumulate", accumulate), ("per_layer", per_layer), ("out", out),
                        ("resume", resume), ("checkpoint_every", checkpoint_every),
                        ("trace_format", trace_layout), ("overwrite", overwrite)):
        check_field(name, value)
    allow_changes = frozenset(check_field("allow_changes", allow_changes))
    if progress is not None:
        check_flag("progress", progress)
    run = _prepare(model, data, optimizer, scaler, policy, loss, steps, batch_size, seed,
                   accumulate, per_layer, schedule, recorded or {})
    identity = run_identity(run.settings, run.optimizer, data, model)
    rng = backend.host_rng(seed)
    state, start, resume_notes = run.scaler.init(), 0, []
    if resume is not None:
        start, state, resume_notes = restore_checkpoint(resume, model, run.optimizer,
                                                        run.scaler, rng, identity,
                                                        allow_changes)
        if start >= steps:
            raise ValueError(f"checkpoint {resume} is at step {start}; ask for more than "
                             f"{start} steps to continue")
    with contextlib.ExitStack() as stack:
        stack.enter_context(run.kept_layers)
        outputs = open_outputs(stack, out, trace_layout, run.settings, start, resume,
                               overwrite, identity, allow_changes, lr=run.lrs is not None)
        tables = _open_tables(stack, run, outputs.folder, start)
        saving = _Saving(outputs.folder, checkpoint_every, identity)
        result = _steps(run, outputs, tables, saving, state, rng, range(start, steps),
                        progress)
        result.notes[:0] = resume_notes + outputs.notes
        result.out = None if out is None else Path(out)     # not the folder it was built in
        if outputs.folder is not None:
            saving.save(run, result.scaler_state, rng, steps)
            finish_run_json(outputs.folder, result, run.settings, start, identity)
    return result


def _prepare(model, data, optimizer, scaler, policy, loss, steps, batch_size, seed,
             accumulate, per_layer, schedule, recorded: dict) -> _Run:
    """Every check of the run, one forward pass and loss on two samples included: bad input
    raises before anything is written."""
    check_instance("model", model, Module, "an fpsim.nn.Module (e.g. nn.MLP([16, 32, 4]))")
    check_instance("data", data, Dataset, "an fpsim.train.Dataset")
    data.check()         # its arrays may have been written into since it was built
    if batch_size > len(data):
        raise ValueError(f"batch_size must be at most the {len(data)} samples of data "
                         f"{data.name!r} (batches are drawn from them with replacement), got "
                         f"{batch_size}")
    policy = get_policy(policy)
    _check_parameter_formats(model, policy)
    recipe = recipe_for(policy)
    with use_policy(policy):
        optimizer = (optimizer if optimizer is not None
                     else Optimizer(model, SGD(lr=0.1), master=recipe.master))
    _check_optimizer_fits(model, optimizer)
    if isinstance(scaler, str) and scaler.strip().lower() == "recipe":
        scaler = recipe.scaler
    scaler = get_scaler(scaler)
    loss_fn, loss_name = resolve_loss(loss, data)
    kept_layers = KeptLayers(model, policy.fp8)      # a recipe's keep=: names checked now
    with kept_layers:
        _dry_run(model, data, policy, loss_fn)
    kept_layers.check_they_run_gemms()
    seed_stochastic_rounding(model, seed)
    settings = dict(recorded, policy=policy.name, steps=steps, batch_size=batch_size,
                    seed=seed, optimizer=repr(optimizer.rule),
                    master=str(optimizer.master_fmt) if optimizer.master_fmt else None,
                    clip_norm=optimizer.clip_norm, scaler=repr(scaler), data=data.name,
                    model=type(model).__name__, scaler_name=scaler_name(scaler),
                    loss=loss_name, per_layer=bool(per_layer),
                    **recipe_record(recipe, optimizer.master_fmt, scaler))
    if accumulate != 1:          # recorded where it is used: earlier runs' identities hold
        settings["accumulate"] = accumulate
    lrs = None
    if schedule is not None:
        schedule = parse_schedule(schedule) if isinstance(schedule, str) else schedule
        check_instance("schedule", schedule, Schedule, "a schedule of fpsim.optim.schedules "
                       "or its string, e.g. 'cosine:t_max=100'")
        base_lr = getattr(optimizer.rule, "lr", None)
        lrs = schedule.lrs(steps, base_lr)       # torch's lrs from the rule's: cheap to replay
        optimizer.set_learning_rate(base_lr)     # refuses a rule without an lr, now
        settings["schedule"] = schedule.record()
    if policy.fp8 is not None:
        settings["fp8"] = policy.fp8.record()
    return _Run(model, data, optimizer, policy, scaler, loss_fn, kept_layers, steps,
                batch_size, accumulate, bool(per_layer), lrs, settings)


@dataclass(frozen=True)
class _Saving:
    """Where and how often the run saves its checkpoint."""

    folder: Path | None
    every: int | None
    identity: dict

    def save(self, run: _Run, state, rng, step: int) -> None:
        save_training_checkpoint(self.folder / "checkpoint.npz", run.model, run.optimizer,
                                 state, rng, step, self.identity)

    def due(self, step: int) -> bool:
        """Whether a checkpoint is taken after ``step`` steps (the end's aside)."""
        return self.folder is not None and bool(self.every) and step % self.every == 0


def _open_tables(stack, run: _Run, folder, start: int) -> tuple:
    """(per-layer table, FP8 table): each (names, writer, stats) or None when not recorded."""
    layers = fp8 = None
    if run.per_layer:
        names = tuple(name for name, _ in run.optimizer.named)
        layers = (names, *open_step_table(stack, LAYERS, folder, names, start))
    if run.policy.fp8 is not None:       # the dry run has met every GEMM
        names = tensor_names(run.model, run.policy.fp8)
        fp8 = (names, *open_step_table(stack, FP8_TABLE, folder, names, start))
    return layers, fp8


def _micro_batches(run: _Run, rng, scale: float) -> float:
    """Forward and backward of the step's micro-batches (underflow is counted in backward
    only); returns the step's loss: the sum of the divided micro-batch losses, in float64,
    rounded to float32."""
    total = 0.0
    for _ in range(run.accumulate):
        idx = rng.integers(0, len(run.data), run.batch_size)
        with use_policy(run.policy):
            loss = run.loss_fn(run.model(batch_inputs(run.data.x[idx])), run.data.y[idx])
            if run.accumulate != 1:
                loss = loss / run.accumulate
            loss.backward(xp.full(loss.shape, scale, xp.float32))
        total += float(loss.item())
    return total if run.accumulate == 1 else float(xp.asarray(total, xp.float32))


def _steps(run: _Run, outputs: Outputs, tables: tuple, saving: _Saving, state, rng,
           step_range, progress) -> TrainResult:
    records: list[StepRecord] = list(outputs.kept)
    layers, fp8 = tables
    names, layer_writer, layer_stats = layers or ((), None, [])
    fp8_names, fp8_writer, fp8_stats = fp8 or ((), None, [])
    optimizer, writer = run.optimizer, outputs.writer
    nonfinite: list[int] = [r.step for r in records if not xp.isfinite(r.loss)]
    bar = progress_bar(run.steps, step_range.start, "step", progress)
    try:
        for step in step_range:
            began = time.perf_counter()
            scale = state.scale
            with count_gradient_underflow() as counts, \
                    (count_per_tensor() if layers else contextlib.nullcontext()) as charged:
                value = _micro_batches(run, rng, scale)
            gradients = _gradient_statistics(optimizer, charged) if layers else None
            lr = None if run.lrs is None else run.lrs[step]
            if lr is not None:
                optimizer.set_learning_rate(lr)
            report = optimizer.step(state, per_parameter=bool(layers))
            optimizer.zero_grad()
            state = report.scaler_state
            record = StepRecord(step, value, scale, report.found_inf, report.skipped,
                                report.grad_norm, counts.fraction, report.lost_fraction,
                                time.perf_counter() - began, lr)
            records.append(record)
            if layers:
                stats = LayerStats(step, *gradients[:1], _lost_fractions(report, len(names)),
                                   *gradients[1:])
                layer_stats.append(stats)
                if layer_writer is not None:
                    layer_writer.write(stats)
            if fp8:
                fp8_stats.append(collect_fp8(run.model, fp8_names, step))
                if fp8_writer is not None:
                    fp8_writer.write(fp8_stats[-1])
            if not xp.isfinite(value):
                nonfinite.append(step)
            if writer is not None:
                writer.write(record)
            if saving.due(step + 1):
                saving.save(run, state, rng, step + 1)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4g}", scale=f"{scale:g}")
    finally:
        if bar is not None:
            bar.close()
        for table_writer in (writer, layer_writer, fp8_writer):
            if table_writer is not None:
                table_writer.close()
    return TrainResult(records, state, optimizer, outputs.folder, nonfinite, layer_names=names,
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


