"""The generated language and the runs the language-model experiments (``lstm_lm``,
``transformer_lm``) share: the source, seven precision recipes, their numbers, the summary.

The source is a first-order Markov chain over ``VOCAB`` = 16 tokens: the next token is
``(successor[current] + offset) mod 16``, ``successor`` a seeded permutation and the offset
0, 1, 2 or 3 with probabilities 8/16, 4/16, 2/16, 2/16. The first token is uniform, and every
row of the transition matrix is a shifted copy of one distribution (the matrix is doubly
stochastic), so every token is uniform and every next token has the same conditional entropy
H = 1/2 * 1 + 1/4 * 2 + 2 * 1/8 * 3 = 1.75 bits: no model can reach a mean cross-entropy below
1.75 * ln 2 = 1.2130 nats, and a model that learns the table reaches it. The probabilities are
sixteenths, so drawing a token is an integer lookup (``rng.integers(0, 16)``) and H is exact;
the sequences are the same bits on every machine.

Each experiment trains its model from the same initial draws (rounded once into the policy's
storage format) on the same batches under seven recipes: fp32, "16-mixed" without loss
scaling, with a static scale of 128 and with torch's dynamic GradScaler, "bf16-mixed", and the
pure 16-bit recipes "16-true" and "bf16-true" (no master copy, Lightning's
``HalfPrecision``), all with Adam at torch's eps = 1e-8.
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd import use_policy
from ..optim import Adam, Optimizer
from ..optim.arith import Arith
from ..plots.language import plot_language
from ..train import Dataset, recipe_for, train
from . import Result
from ._tasks import json_float
from .cnn import TRACKING
from .loss_curves import median, typical_gap
from .recipes import first_step_moments

__all__ = ["run_language_experiment", "VOCAB", "LENGTH", "BATCH", "STATIC_SCALE", "EPS", "RUNS",
           "markov_source", "entropy_nats", "train_one", "run_all", "summary", "table"]

VOCAB, LENGTH, SEQUENCES, BATCH = 16, 8, 2048, 64
OFFSET_SIXTEENTHS = (8, 4, 2, 2)     # P(offset = k) = OFFSET_SIXTEENTHS[k] / 16
EPS = 1e-8                           # Adam's eps, torch's default
STATIC_SCALE = 128
# A run lags fp32 only when its typical gap is also above this many nats: where the reference
# runs differ from fp32 by 1e-5, TRACKING times that is no measure of lagging.
LAG_FLOOR = 0.01
RUNS = {  # label: (policy, scaler); the master copy is the recipe's (fp32 for *-mixed)
    "fp32 (32-true)": ("32-true", "none"),
    "16-mixed, no loss scaling": ("16-mixed", "none"),
    f"16-mixed, loss scale {STATIC_SCALE}": ("16-mixed", f"static:{STATIC_SCALE}"),
    "16-mixed, dynamic scaling (torch)": ("16-mixed", "dynamic"),
    "bf16-mixed": ("bf16-mixed", "none"),
    "16-true": ("16-true", "none"),
    "bf16-true": ("bf16-true", "none"),
}


def markov_source(n: int = SEQUENCES, seed: int = 0) -> Dataset:
    """``n`` sequences of ``LENGTH + 1`` tokens as a language-model data set: inputs the
    first ``LENGTH`` tokens, labels the ``LENGTH`` tokens after them."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(VOCAB)
    offset_of_draw = np.repeat(np.arange(len(OFFSET_SIXTEENTHS)), OFFSET_SIXTEENTHS)
    tokens = np.empty((n, LENGTH + 1), np.int64)
    tokens[:, 0] = rng.integers(0, VOCAB, n)
    for t in range(1, LENGTH + 1):
        offset = offset_of_draw[rng.integers(0, 16, n)]
        tokens[:, t] = (successor[tokens[:, t - 1]] + offset) % VOCAB
    return Dataset(tokens[:, :-1], tokens[:, 1:], VOCAB, "markov")


def entropy_nats() -> float:
    """The source's entropy per token, the least mean cross-entropy: sum of p * log2(1/p)
    with p = c/16 (log2(16/c) exact for c a power of two), times ln 2."""
    bits = math.fsum(c / 16 * math.log2(16 / c) for c in OFFSET_SIXTEENTHS)
    return bits * math.log(2)


def _mean(values) -> float:
    values = [float(v) for v in values]
    return math.fsum(values) / len(values)


def train_one(build, policy: str, scaler: str, steps: int, data: Dataset, lr: float) -> dict:
    """One run: ``build()`` called under ``policy`` (its parameters in the policy's storage
    format), Adam(lr, eps=EPS) with the recipe's master copy, the seed-0 batches."""
    with use_policy(policy):
        model = build()
    optimizer = Optimizer(model, Adam(lr=lr, eps=EPS), master=recipe_for(policy).master)
    # 16-true's Adam produces inf/NaN: that is a finding, not an error
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        result = train(model, data, optimizer=optimizer, policy=policy, scaler=scaler,
                       steps=steps, batch_size=BATCH, seed=0, progress=False, per_layer=True)
    records = result.records
    losses = [float(r.loss) for r in records]
    tail = max(1, steps // 10)
    underflow = [float(r.underflow_fraction) for r in records]
    lost = [float(r.lost_update_fraction) for r in records]
    finite_tail = all(math.isfinite(v) for v in losses[-tail:])
    return {"policy": policy, "scaler": scaler, "master": recipe_for(policy).master,
            "losses": [json_float(v) for v in losses], "loss_sha256": result.loss_hash,
            "underflow_fraction": underflow, "lost_update_fraction": lost,
            "final_loss": median(losses[-tail:]) if finite_tail else json_float(math.nan),
            "first_nonfinite_step": (result.nonfinite_steps[0] if result.nonfinite_steps
                                     else None),
            "mean_underflow_fraction": _mean(underflow),
            "first_underflow_fraction": _mean(underflow[:tail]),
            "final_underflow_fraction": _mean(underflow[-tail:]),
            "mean_lost_update_fraction": _mean(lost),
            "final_lost_update_fraction": _mean(lost[-tail:]),
            "skipped_steps": int(sum(r.skipped for r in records)),
            "skipped_at": [r.step for r in records if r.skipped],
            # per parameter, the share of its own gradient's values flushed, over the run
            "parameter_gradient_underflow": {
                name: json_float(_mean(s.grad_underflow[i] for s in result.layers))
                for i, name in enumerate(result.layer_names)},
            "final_scale": json_float(result.scaler_state.scale)}


def run_all(ctx, name: str, build, lr: float, steps: int) -> dict:
    """Every recipe of ``RUNS`` on the source, then what breaks 16-true: Adam's eps in fp16
    and its moments after one step. Returns the experiment's numbers, all but the model's
    description."""
    data = markov_source()
    entropy = entropy_nats()
    runs = {}
    for label, (policy, scaler) in RUNS.items():
        ctx.progress(f"{name}: {label}, {steps} steps")
        runs[label] = train_one(build, policy, scaler, steps, data, lr)
    fp32 = runs[next(iter(RUNS))]
    for r in runs.values():
        finite = isinstance(r["final_loss"], float)
        r["final_gap_to_entropy"] = (r["final_loss"] - entropy) if finite else r["final_loss"]
        r["final_gap_to_fp32"] = (r["final_loss"] - fp32["final_loss"]) if finite \
            else r["final_loss"]
        r["typical_gap_to_fp32"] = json_float(typical_gap(
            [float(v) for v in r["losses"]], [float(v) for v in fp32["losses"]]))
    with use_policy("16-true"):
        model = build()
    diagnosis = {"adam_eps_in_fp16": float(Arith("fp16").scalar(EPS)),
                 "adam_eps_in_bf16": float(Arith("bf16").scalar(EPS)),
                 "16_true_moments_after_step_1": first_step_moments(
                     "16-true", data, EPS, model=model, lr=lr, batch_size=BATCH)}
    return {"data": (f"first-order Markov source, {VOCAB} tokens, offsets 0-3 with "
                     f"probabilities {'/16, '.join(map(str, OFFSET_SIXTEENTHS))}/16, "
                     f"{SEQUENCES} sequences of {LENGTH} + 1 tokens"),
            "entropy_nats": entropy, "optimizer": f"Adam lr {lr} eps {EPS:g}",
            "batch": BATCH, "tokens_per_batch": BATCH * LENGTH, "steps": steps,
            "runs": runs, "diagnosis": diagnosis}


def run_language_experiment(ctx, name: str, title: str, model: str, build, lr: float,
                            label: str) -> Result:
    """One experiment of this family: every run of ``RUNS`` on ``build``'s model (10 steps
    quick, 40 full), its figure (``label`` names the model there) and its summary."""
    steps = 10 if ctx.quick else 40
    numbers = {"model": model, **run_all(ctx, name, build, lr, steps)}
    figures = plot_language(numbers["runs"], numbers["entropy_nats"], label, ctx.out / name)
    return Result(name, title, numbers, [p.name for p in figures], summary(numbers),
                  table(numbers))


def _pct(x: float) -> str:
    """A share in percent, small ones with two significant digits (0.048%), none hidden
    as 0.0%."""
    return f"{100 * x:.1f}%" if x == 0 or x >= 0.01 else f"{100 * x:.2g}%"


def _gap(x: float) -> str:
    """A loss gap: four decimals, or two significant digits below 0.001."""
    return f"{x:.4f}" if x >= 1e-3 or x == 0 else f"{x:.2g}"


def _loss(x) -> str:
    return f"{x:.4f}" if isinstance(x, float) and math.isfinite(x) else "NaN"


def table(numbers: dict) -> str:
    """The summary's table: one row a recipe."""
    rows = ["| run | final loss (entropy " + _loss(numbers["entropy_nats"]) + ") | typical gap "
            "to fp32 | gradient values flushed to 0 (mean / last 10%) | updates lost "
            "(mean / last 10%) | skipped steps | final scale |", "|---|---|---|---|---|---|---|"]
    for label, r in numbers["runs"].items():
        gap = r["typical_gap_to_fp32"]
        shown = _gap(gap) if isinstance(gap, float) and math.isfinite(gap) else "NaN"
        rows.append(f"| {label} | {_loss(r['final_loss'])} | {shown} | "
                    f"{_pct(r['mean_underflow_fraction'])} / "
                    f"{_pct(r['final_underflow_fraction'])} | "
                    f"{_pct(r['mean_lost_update_fraction'])} / "
                    f"{_pct(r['final_lost_update_fraction'])} | {r['skipped_steps']} | "
                    f"{r['final_scale']:g} |")
    return "\n".join(rows)


def summary(numbers: dict) -> str:
    """The paragraph of ``summary.md`` for one language model, every claim read from
    ``numbers`` (``run_all``'s, with ``model`` added)."""
    runs = numbers["runs"]
    fp32, none, static, dynamic, bf16, true16, truebf16 = runs.values()
    entropy, steps = numbers["entropy_nats"], numbers["steps"]
    tail = max(1, steps // 10)
    last = f"last {tail} steps" if tail > 1 else "last step"
    # As in the CNN experiment: a run tracks fp32 when its typical gap is within TRACKING
    # times that of the static-scale and bf16 runs, which differ from fp32 by rounding alone.
    noise = max(LAG_FLOOR, TRACKING * max(r["typical_gap_to_fp32"] for r in (static, bf16)))
    tracks = none["typical_gap_to_fp32"] <= noise
    text = (
        f"{numbers['model']} on a generated language ({numbers['data']}): every next token "
        f"has the same conditional entropy, 1.75 bits = {entropy:.4f} nats, the least loss "
        f"any model can reach. Adam (lr {numbers['optimizer'].split()[2]}, eps 1e-8), "
        f"batch {numbers['batch']} sequences ({numbers['tokens_per_batch']} predicted "
        f"tokens, the loss their mean), {steps} steps per run from the same weights on the "
        f"same batches (final loss: median of the {last}; typical gap: median distance of "
        f"the 10-step means to fp32's). fp32 ends at {_loss(fp32['final_loss'])}, "
        f"{fp32['final_gap_to_entropy']:+.4f} from the entropy. ")
    first = f"first {tail} steps" if tail > 1 else "first step"
    text += _no_scaling(none, static, bf16, fp32, tracks, (first, last),
                        numbers["tokens_per_batch"])
    text += _dynamic(dynamic)
    text += _pure_16_bit(true16, truebf16, numbers["diagnosis"])
    return text


def _no_scaling(none: dict, static: dict, bf16: dict, fp32: dict, tracks: bool,
                windows: tuple[str, str], tokens: int) -> str:
    first, last = windows
    flushed = (f"16-mixed without loss scaling flushes {_pct(none['mean_underflow_fraction'])} "
               f"of the nonzero gradient values to zero in backward on average "
               f"({_pct(none['first_underflow_fraction'])} over the {first}, "
               f"{_pct(none['final_underflow_fraction'])} over the {last}; a scale of "
               f"{STATIC_SCALE}: {_pct(static['final_underflow_fraction'])}; bf16-mixed, with "
               f"fp32's range: {_pct(bf16['final_underflow_fraction'])})")
    where = _where_flushed(none["parameter_gradient_underflow"])
    if tracks:
        return (f"{flushed}, and ends at {_loss(none['final_loss'])} (typical gap to fp32 "
                f"{_gap(none['typical_gap_to_fp32'])}; scale {STATIC_SCALE}: "
                f"{_loss(static['final_loss'])}, gap {_gap(static['typical_gap_to_fp32'])}; "
                f"bf16-mixed: {_loss(bf16['final_loss'])}, gap "
                f"{_gap(bf16['typical_gap_to_fp32'])}). So the bigLSTM story does not "
                f"occur at this size: no scaling does not lag. The source's entropy keeps "
                f"p - onehot away from 0 for the tokens that can follow (even the best model "
                f"gives the right one a probability of at most {max(OFFSET_SIXTEENTHS)}/16), "
                f"and with a mean "
                f"over {tokens} tokens of a {VOCAB}-word softmax what fp16 flushes is too "
                f"little to matter; the paper's bigLSTM averages a softmax over hundreds of "
                f"thousands of words, whose gradients are far smaller. " + where)
    return (f"{flushed}, and lags: it ends at {_loss(none['final_loss'])} against fp32's "
            f"{_loss(fp32['final_loss'])} (typical gap {_gap(none['typical_gap_to_fp32'])}), "
            f"while a scale of {STATIC_SCALE} ends at {_loss(static['final_loss'])} (gap "
            f"{_gap(static['typical_gap_to_fp32'])}) and bf16-mixed at "
            f"{_loss(bf16['final_loss'])} (gap {_gap(bf16['typical_gap_to_fp32'])}): the "
            f"bigLSTM story, the gradients fp16 flushes being signal the model still needs. "
            + where)


def _where_flushed(per_parameter: dict) -> str:
    """Whether the flushed values include the parameters' own gradients, or lie only in the
    activation gradients backward computes on the way (the counts cover every rounding)."""
    name, worst = max(per_parameter.items(), key=lambda item: (item[1], item[0]))
    if not worst:
        return ("Not one flushed value belongs to a parameter's gradient: they are all "
                "activation gradients inside backward. ")
    return (f"Of a parameter's own gradient at most {_pct(worst)} of the values are flushed "
            f"({name}, averaged over the run); the other flushed values are activation "
            f"gradients inside backward. ")


def _dynamic(dynamic: dict) -> str:
    if not dynamic["skipped_steps"]:
        return (f"Torch's dynamic scaler never overflows (no skipped step; final scale "
                f"{dynamic['final_scale']:g}; final loss {_loss(dynamic['final_loss'])}, "
                f"typical gap {_gap(dynamic['typical_gap_to_fp32'])}). ")
    at = ", ".join(map(str, dynamic["skipped_at"]))
    plural = "s" if dynamic["skipped_steps"] > 1 else ""
    return (f"Torch's dynamic scaler starts at 65536, where scaled gradients overflow fp16: "
            f"it skips step{plural} {at} and backs off to {dynamic['final_scale']:g}, ending "
            f"at {_loss(dynamic['final_loss'])} (typical gap to fp32 "
            f"{_gap(dynamic['typical_gap_to_fp32'])}). ")


def _pure_16_bit(true16: dict, truebf16: dict, diagnosis: dict) -> str:
    moments = diagnosis["16_true_moments_after_step_1"]
    bf16_text = (f"`bf16-true` trains without a master copy to "
                 f"{_loss(truebf16['final_loss'])}, though rounding to bf16 loses "
                 f"{_pct(truebf16['mean_lost_update_fraction'])} of its updates on average "
                 f"({_pct(truebf16['final_lost_update_fraction'])} over the last steps); "
                 f"eps is {diagnosis['adam_eps_in_bf16']:.3g} in bf16, with fp32's range.")
    if true16["first_nonfinite_step"] is None:
        return (f"`16-true` (fp16 weights and Adam state, no master copy) stays finite and "
                f"ends at {_loss(true16['final_loss'])}, although eps = 1e-8 is "
                f"{diagnosis['adam_eps_in_fp16']:g} in fp16. " + bf16_text)
    return (f"The fine-tuning story (here training from scratch): `16-true` (fp16 weights "
            f"and Adam state, no master copy) gives a NaN loss from step "
            f"{true16['first_nonfinite_step']}. Adam's eps = 1e-8 rounds to "
            f"{diagnosis['adam_eps_in_fp16']:g} in fp16, and after the first step the second "
            f"moment v = (1 - beta2) * g^2 is 0 while the first moment m is not in "
            f"{_pct(moments['v_zero_m_nonzero'])} of all entries (update m/0 = inf) and both "
            f"are 0 in {_pct(moments['v_zero_m_zero'])} (0/0 = NaN), as in the recipes "
            f"experiment. " + bf16_text)
