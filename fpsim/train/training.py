"""``train``: a run from a ``TrainConfig`` (what ``fpsim train`` and sweep cells do), or a
model and data of the user's own.

``train(config)`` builds the data, the model (in the policy's parameter format), the
optimizer and the scaler the configuration names, then runs ``train_model``;
``train(model, data, **options)`` runs it on the user's own objects.
"""
from __future__ import annotations

from typing import NamedTuple

from ..autograd import get_policy, use_policy
from ..optim import SGD, Adam, AdamW, Optimizer
from ..scaling import get_scaler
from .config import TrainConfig
from .factories import build_data, build_model, is_factory, load_factory
from .loop import TrainResult, train_model
from .recipes import Recipe, recipe_for

__all__ = ["train", "run_config", "Resolved", "resolve"]

_RULES = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def train(model, data=None, **options) -> TrainResult:
    """Train, bit-exact, every step recorded.

    ``train(config)``: the run a ``TrainConfig`` describes (``fpsim train``'s options;
    ``progress=`` may be given besides).

    ``train(model, data, **options)``: ``model`` any ``fpsim.nn.Module`` whose parameters are
    in the policy's ``param`` format (build it under ``use_policy(policy)``), ``data`` a
    ``Dataset`` of any shape. Everything is checked before the first step (one forward pass
    and loss on two samples included): bad input raises ``ValueError``/``TypeError`` and
    nothing is written. Options (the ``TrainConfig`` fields' checks apply):

    - ``policy`` (``"16-mixed"``): a precision string or ``Policy``;
    - ``optimizer``: an ``Optimizer`` built for ``model`` (default: SGD(lr=0.1) with the
      master copy the policy's recipe keeps, ``recipe_for``: fp32 for the mixed recipes, none
      for the true ones);
    - ``scaler``: what ``fpsim.scaling.get_scaler`` accepts, or ``"recipe"`` (the default: the
      recipe's, torch's dynamic GradScaler for "16-mixed", none otherwise);
    - ``loss``: ``"cross_entropy"`` (logits ``(batch, ..., classes)`` against labels
      ``(batch, ...)``, per-token labels averaged over every position), ``"mse"``, a function
      ``loss(output, targets)`` returning a one-element ``Tensor``, or ``"auto"`` (the
      default): cross-entropy for labels, mse for regression targets;
    - ``schedule``: a learning-rate schedule (``fpsim.optim.schedules``: an object or its
      string, ``"cosine:t_max=100"``) from the optimizer's lr, torch's lr bit for bit; each
      step's lr is set (``Optimizer.set_learning_rate``) and recorded in the trace;
    - ``steps`` (100), ``batch_size`` (64: drawn with replacement, at most ``len(data)``),
      ``accumulate`` (1: micro-batches per step, their gradients added, each loss divided by
      ``accumulate``), ``seed`` (0);
    - ``per_layer``: also record, per parameter and step, the fraction of its gradient values
      that underflowed, of its updates that were lost, and its largest gradient magnitude
      (``TrainResult.layers``; ``layers.jsonl`` with ``out``);
    - ``out``: a folder for ``run.json``, ``trace.jsonl`` (``trace_layout="csv"``: .csv) and
      ``checkpoint.npz`` (every ``checkpoint_every`` steps and at the end), locked meanwhile.
      A folder that holds a run is refused unless ``resume`` continues it or
      ``overwrite=True`` replaces it (the old run is kept until the new one is complete);
    - ``resume``: a checkpoint of an earlier run with the same configuration (``steps``
      aside; ``allow_changes`` may name fields of ``ADJUSTABLE_ON_RESUME``); the trace in
      ``out`` must hold every step before the checkpoint's, later steps are dropped
      (``TrainResult.notes`` says so);
    - ``progress``: a progress bar (default: when the output is a terminal).
    """
    if isinstance(model, TrainConfig):
        if data is not None or set(options) - {"progress"}:
            given = ["data"] * (data is not None) + sorted(set(options) - {"progress"})
            raise TypeError(f"train(config) takes the run from the TrainConfig; got "
                            f"{', '.join(given)} besides (change the config instead: "
                            f"config.replace(...))")
        return run_config(model, progress=options.get("progress"))
    if data is None:
        raise TypeError("train needs a TrainConfig, or a model and its data: "
                        "train(model, data, ...)")
    return train_model(model, data, **options)


class Resolved(NamedTuple):
    """What a configuration's strings resolve to: the policy, its recipe, the master format
    (None: no master copy) and the scaler configuration."""

    policy: object
    recipe: Recipe
    master: object
    scaler: object


def resolve(config: TrainConfig) -> Resolved:
    """The policy, recipe, master copy and scaler ``config`` names (``--master`` and
    ``--scaler`` override the recipe's)."""
    policy = get_policy(config.policy)
    recipe = recipe_for(policy)
    master = recipe.master if config.master is None else \
        (None if config.master == "none" else config.master)
    scaler = get_scaler(recipe.scaler if config.scaler is None else config.scaler)
    return Resolved(policy, recipe, master, scaler)


def run_config(config: TrainConfig, *, progress: bool | None = None) -> TrainResult:
    """Build what ``config`` names and train it (see ``train``)."""
    resolved = resolve(config)
    data = build_data(config.data, config.data_args, samples=config.samples,
                      features=config.features, classes=config.classes, seed=config.seed)
    if config.batch_size > len(data):
        raise ValueError(f"--batch-size must be at most the {len(data)} samples of the data "
                         f"(batches are drawn from them with replacement), got "
                         f"{config.batch_size}")
    rule_options = dict(lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "sgd":
        rule_options["momentum"] = config.momentum
    rule = _RULES[config.optimizer](**rule_options)
    loss = load_factory(config.loss, "--loss") if is_factory(config.loss) else config.loss
    with use_policy(resolved.policy):
        model = build_model(config.model, config.model_args, data, hidden=list(config.hidden),
                            activation=config.activation, seed=config.seed)
        optimizer = Optimizer(model, rule, master=resolved.master, clip_norm=config.clip_norm)
    return train_model(model, data, optimizer=optimizer, scaler=resolved.scaler,
                       policy=resolved.policy, steps=config.steps,
                       batch_size=config.batch_size, accumulate=config.accumulate,
                       schedule=config.schedule,
                       seed=config.seed, out=config.out, trace_layout=config.trace_format,
                       checkpoint_every=config.checkpoint_every, resume=config.resume,
                       progress=progress, overwrite=config.overwrite,
                       allow_changes=config.allow_changes, loss=loss,
                       per_layer=config.per_layer, recorded=config.record())
