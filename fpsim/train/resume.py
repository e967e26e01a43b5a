"""Checkpoints of a training run, and the checks that make a resume exact or refused.

A training checkpoint holds the model's parameters (``param/...``), the optimizer's arrays
(``optim/...``) and metadata: the step, the batch generator's state, the scaler's counters and
the run's configuration (``run_identity``). ``restore_checkpoint`` checks all of it against
the run being resumed before it changes anything: the configuration field by field (a
difference is refused, naming the fields, unless it is in ``ADJUSTABLE_ON_RESUME`` and
allowed), the metadata keys and types, every array's name, shape and dtype, and the values
(finite weights and master copies, the weights the rounding of their master copies).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from pathlib import Path

from .. import backend
from ..autograd.numerics import round_array
from ..backend import xp
from ..optim import Optimizer
from ..scaling import ScalerState
from .checkpoint import (CheckpointError, check_step_counts, load_checkpoint,
                         save_checkpoint)
from .data import Dataset

__all__ = ["ADJUSTABLE_ON_RESUME", "check_allowed_changes", "run_identity",
           "save_training_checkpoint", "restore_checkpoint", "check_same_config"]

# Configuration fields a resumed run may change when asked to (``allow_changes``): they steer
# the next updates without changing what the checkpoint's state means.
ADJUSTABLE_ON_RESUME = ("lr", "weight_decay", "clip_norm")

# Fields fpsim 0.1 recorded for every run but that reach only some (the built-in data sets'
# sizes, the built-in mlp's layers): a checkpoint may hold them where this run, which does not
# use them, does not record them.
RECORDED_WHERE_USED = ("samples", "features", "classes", "hidden", "activation")

_COUNTERS = ("scale", "growth_tracker", "hysteresis_left", "step", "last_overflow_step",
             "consecutive_skips", "total_skips", "total_overflows", "growths", "backoffs")


def check_allowed_changes(allow_changes) -> frozenset:
    if isinstance(allow_changes, str):
        allow_changes = [allow_changes]
    allowed = frozenset(allow_changes)
    wrong = sorted(str(name) for name in allowed if name not in ADJUSTABLE_ON_RESUME)
    if wrong:
        raise ValueError(f"allow_changes: {', '.join(wrong)} cannot change on resume (the "
                         f"checkpoint's state depends on it); fields that can: "
                         f"{', '.join(ADJUSTABLE_ON_RESUME)}")
    return allowed


def run_identity(settings: dict, optimizer: Optimizer, data: Dataset, model) -> dict:
    """The configuration a checkpoint belongs to, field by field (``steps`` aside): what a
    resumed run must match."""
    # the recipe's account (recipe, overrides, scaler_name) follows from policy, master and
    # scaler, which are compared themselves
    derived = ("steps", "optimizer", "command", "recipe", "overrides", "scaler_name",
               "data_spec",      # the data is compared by its bytes (data_sha256)
               "train_config")   # the options again; what they resolve to is compared
    ident = {k: v for k, v in settings.items() if k not in derived}
    rule = optimizer.rule
    ident["optimizer"] = type(rule).__name__
    if dataclasses.is_dataclass(rule):
        ident.update({f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})
    ident["data_sha256"] = hashlib.sha256(backend.host_bytes(data.x)
                                          + backend.host_bytes(data.y)).hexdigest()
    ident["parameters"] = {name: [str(p.fmt), *map(int, p.shape)]
                           for name, p in model.named_parameters()}
    return json.loads(json.dumps(ident, default=str))   # as it reads back from a checkpoint


def save_training_checkpoint(path: Path, model, optimizer: Optimizer, state: ScalerState, rng,
                             step: int, identity: dict) -> None:
    """Save the run's state after ``step`` steps (atomically: ``save_checkpoint``)."""
    arrays = {f"param/{name}": value for name, value in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    meta = {"step": step, "rng": rng.bit_generator.state, "config": identity,
            "scaler": {name: getattr(state, name) for name in _COUNTERS},
            "modules": _extra_states(model)}
    save_checkpoint(path, arrays, meta)


def _extra_states(model) -> dict:
    return {name: extra for name, module in model.named_modules()
            if (extra := module.extra_state())}


_META_KEYS = ("step", "rng", "scaler", "config")
_OPTIONAL_META = ("modules",)       # modules' extra state (Dropout offsets); absent before


def restore_checkpoint(path, model, optimizer: Optimizer, scaler_cfg, rng, identity: dict,
                       allow_changes: frozenset):
    """Check the checkpoint completely against this run, then load it into ``model``,
    ``optimizer`` and ``rng``; returns (step, scaler state, notes on what was filled in)."""
    arrays, meta = load_checkpoint(path)

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {problem}")

    unknown = sorted(set(meta) - set(_META_KEYS) - set(_OPTIONAL_META))
    missing = [k for k in _META_KEYS if k not in meta]
    if unknown or missing:
        raise bad(f"metadata has unknown keys {unknown} / lacks {missing}; an fpsim training "
                  f"checkpoint has {', '.join(_META_KEYS)}")
    step = meta["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"step must be a non-negative integer, got {step!r}")
    check_same_config(f"checkpoint {path}", meta["config"], identity, allow_changes)
    state = _scaler_state(meta["scaler"], scaler_cfg, bad)
    probe = copy.deepcopy(rng)
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
    notes = _counts_fpsim_0_1_lacks(params, own, path)
    if set(params) != set(own):
        raise bad(f"parameters {sorted(set(own) - set(params))[:5]} missing, "
                  f"{sorted(set(params) - set(own))[:5]} unknown: it does not fit this model")
    for name, value in params.items():
        if value.shape != own[name].shape or value.dtype != own[name].dtype:
            raise bad(f"parameter {name!r} is {value.dtype}{list(value.shape)}, the model's "
                      f"is {own[name].dtype}{list(own[name].shape)}")
    check_step_counts(f"checkpoint {path}", step, state.step, state.total_skips,
                      optim.get("step_count"))
    try:
        model.check_state_dict(params)     # finite weights, a running variance >= 0, ...
    except ValueError as err:
        raise bad(str(err).replace("load_state_dict: ", "parameter ")) from None
    _check_masters(model, optimizer, params, optim, bad)
    try:
        optimizer.load_state_dict(optim)     # checks every array before it changes anything
    except (KeyError, ValueError, TypeError) as err:
        raise bad(f"optimizer state does not fit: {err}") from None
    extra = meta.get("modules", {})
    modules = dict(model.named_modules())
    expected = _extra_states(model)
    if not isinstance(extra, dict) or set(extra) != set(expected):
        held = sorted(extra) if isinstance(extra, dict) else extra
        raise bad(f"it holds extra state for modules {held!r}, this model's modules with extra "
                  f"state are {sorted(expected)}")
    for name, values in extra.items():     # checked before anything changes
        try:
            probe_module = copy.copy(modules[name])
            probe_module.set_extra_state(values)
        except (ValueError, TypeError) as err:
            raise bad(f"module {name!r}: {err}") from None
    model.load_state_dict(params)
    for name, values in extra.items():
        modules[name].set_extra_state(values)
    rng.bit_generator.state = meta["rng"]
    return step, state, notes


def _check_masters(model, optimizer: Optimizer, params: dict, optim: dict, bad) -> None:
    """Every master copy is finite, and the checkpoint's weights are their roundings into the
    weights' formats, as every step writes them: anything else was edited, or put together
    from two runs, and would resume silently wrong. A master the optimizer will refuse for
    its shape or dtype is left to that check, which names it."""
    if optimizer.master_fmt is None:
        return
    weight_names = {id(p): name for name, p in model.named_parameters()}
    for name, p in optimizer.named:
        master = optim.get(f"master/{name}")
        if (master is None or master.shape != tuple(p.shape)
                or not str(master.dtype).startswith("float")):
            continue
        master = xp.array(master, xp.float32)
        nonfinite = xp.count_nonzero(xp.logical_not(xp.isfinite(master)))
        if nonfinite:
            raise bad(f"the master copy of {name!r} holds {int(nonfinite)} NaN/inf value(s); "
                      f"a run cannot continue from it")
        weight = xp.asarray(params[weight_names[id(p)]])
        differ = xp.count_nonzero(xp.not_equal(round_array(master, p.fmt), weight))
        if differ:
            raise bad(f"parameter {weight_names[id(p)]!r} is not its master copy rounded to "
                      f"{p.fmt} ({int(differ)} of its {backend.size(master)} values differ); "
                      f"the weights and master copies come from different states")


def check_same_config(what: str, saved, identity: dict, allow_changes: frozenset) -> None:
    """Refuse to resume when ``saved`` (the configuration recorded in ``what``) differs from
    this run's ``identity`` in any field but those in ``allow_changes``, naming the fields."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{what}: the recorded configuration must be an object, got "
                              f"{saved!r}")
    differ = [k for k in sorted(set(saved) | set(identity))
              if saved.get(k) != identity.get(k) and k not in allow_changes
              and not (k in RECORDED_WHERE_USED and k not in identity)]
    if differ:
        shown = "; ".join(f"{k}: recorded {saved.get(k)!r}, now {identity.get(k)!r}"
                          for k in differ[:6])
        adjustable = [k for k in differ if k in ADJUSTABLE_ON_RESUME]
        hint = (f" ({', '.join(adjustable)} may change if you say so: --allow-change "
                f"{adjustable[0]})" if adjustable else "")
        raise ValueError(f"cannot resume from {what}: the configuration differs in "
                         f"{', '.join(differ)} ({shown}){hint}; resume with the same settings")


def _counts_fpsim_0_1_lacks(params: dict, own: dict, path) -> list:
    """BatchNorm's ``num_batches_tracked`` came in fpsim 0.2: a 0.1 checkpoint lacks it. It
    enters no computation here (momentum is always a number), so it is filled with the
    model's own count (0 in a fresh model), as torch fills it for state dicts older than it;
    the note says so."""
    filled = [name for name in own if name not in params
              and name.rsplit(".", 1)[-1] == "num_batches_tracked"]
    for name in filled:
        params[name] = own[name]
    return [f"checkpoint {path} (fpsim 0.1) holds no BatchNorm num_batches_tracked; "
            f"{', '.join(filled)} counted from {float(own[filled[0]]):g} (it enters no "
            f"computation: every number continues as it would have)"] if filled else []


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
