"""Experiment: NVFP4 training of a transformer language model, each ingredient switched off in
turn, beside bf16-mixed and MXFP4.

The model is ``transformer_lm``'s, wider so that FP4 blocks fit every hidden GEMM: width 32
(NVFP4 blocks of 16 and MX blocks of 32 along every reduction axis), one pre-LN block, two
heads, GELU MLP of width 128, the read-out to the 16 tokens (``head``). It trains on
``_language``'s Markov source from the same initial weights on the same batches under:

- ``bf16-mixed``, the reference;
- ``nvfp4:keep=head``: TE's NVFP4 recipe as the NVFP4 paper trains (the last layer in bf16);
- the same with one ingredient off: ``rht=0`` (no Hadamard transform before the wgrad casts),
  ``sr=0`` (gradients rounded to nearest even), ``2d=0`` (weights in 1x16 blocks), and without
  ``keep=head`` (the read-out in FP4 too); then all four off at once;
- ``mxfp4:keep=head`` (E2M1 in 32-value blocks, E8M0 scales, nearest even).

Why each ingredient matters, or not, is read from the runs' FP8 statistics (``fp8.jsonl``'s
flushed and saturated fractions per cast) and from one measurement the statistics cannot
give: the bias of nearest-even against stochastic rounding on the read-out's output gradient.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..autograd import no_grad, use_policy
from ..backend import xp
from ..optim import Adam, Optimizer
from ..plots.fp4 import plot_fp4
from ..quant import nvfp4_dequantize, nvfp4_quantize
from ..train import recipe_for, train
from ..train.models import TokenTransformer
from . import Context, Result, register
from ._language import BATCH, EPS, LENGTH, VOCAB, markov_source
from ._tasks import json_float
from .loss_curves import median, typical_gap

TITLE = "FP4 recipes: NVFP4's ingredients one at a time on a transformer language model"
WIDTH, HEADS, BLOCKS, LR = 32, 2, 1, 2e-2
REFERENCE, NVFP4 = "bf16-mixed", "NVFP4"
# an ingredient matters here when switching it off takes the loss this many times further
# from bf16's than the whole recipe is (NVFP4's own gap: its quantization noise)
SEPARATES = 2.0
RUNS = {  # label -> recipe string
    REFERENCE: "bf16-mixed",
    NVFP4: "nvfp4:keep=head",
    "no Hadamard transform": "nvfp4:rht=0,keep=head",
    "no stochastic rounding": "nvfp4:sr=0,keep=head",
    "1x16 weight blocks": "nvfp4:2d=0,keep=head",
    "read-out in FP4 too": "nvfp4",
    "every ingredient off": "nvfp4:rht=0,sr=0,2d=0",
    "MXFP4": "mxfp4:keep=head",
}
# the casts of a quantized linear, by role (the part of the name after the layer's)
CASTS = ("input", "weight", "grad_output", "wgrad_input", "wgrad_grad_output")
MODEL = (f"A transformer language model (token and position embeddings of width {WIDTH}, "
         f"{BLOCKS} pre-LN block with {HEADS} heads, the causal mask and a GELU MLP of width "
         f"{4 * WIDTH}, LayerNorm, linear read-out 'head' to {VOCAB} scores)")

__all__ = ["RUNS", "CASTS", "LR", "BATCH", "SEPARATES", "fp4_transformer", "markov_source",
           "rounding_bias", "summary", "run"]


def fp4_transformer() -> TokenTransformer:
    """The experiment's model, seed 0."""
    return TokenTransformer(VOCAB, VOCAB, LENGTH, d_model=WIDTH, heads=HEADS, blocks=BLOCKS,
                            seed=0)


def _mean(values) -> float:
    values = [float(v) for v in values]
    return math.fsum(values) / len(values) if values else math.nan


def _train(policy: str, steps: int, data):
    """One run (Adam, the recipe's master copy, the seed-0 batches); returns the model and
    ``train``'s result."""
    with use_policy(policy):
        model = fp4_transformer()
    optimizer = Optimizer(model, Adam(lr=LR, eps=EPS), master=recipe_for(policy).master)
    result = train(model, data, optimizer=optimizer, policy=policy, steps=steps,
                   batch_size=BATCH, seed=0, progress=False)
    return model, result


def _cast_means(result) -> dict:
    """Per quantized tensor, its flushed and saturated fractions averaged over the run."""
    return {name: {"flushed": _mean(row.flushed[i] for row in result.fp8),
                   "saturated": _mean(row.saturated[i] for row in result.fp8)}
            for i, name in enumerate(result.fp8_names)}


def _by_role(casts: dict, layers: str) -> dict:
    """The mean flushed fraction of each cast role over the layers whose name starts with
    ``layers`` (NaN for a role the recipe has not)."""
    return {role: json_float(_mean(v["flushed"] for name, v in casts.items()
                                   if name.startswith(layers) and name.endswith("." + role)))
            for role in CASTS}


def _run_numbers(policy: str, result, reference_losses, tail: int) -> dict:
    losses = [float(v) for v in result.losses]
    casts = _cast_means(result)
    return {"policy": policy, "loss_sha256": result.loss_hash,
            "losses": [json_float(v) for v in losses],
            "final_loss": median(losses[-tail:]),
            "typical_gap_to_bf16": typical_gap(losses, reference_losses),
            "mean_abs_loss_gap_to_bf16": _mean(abs(a - b)
                                              for a, b in zip(losses, reference_losses)),
            "casts": casts,
            "flushed_by_role_in_block": _by_role(casts, "blocks."),
            "flushed_by_role_in_head": _by_role(casts, "head."),
            "max_saturated": max((v["saturated"] for v in casts.values()), default=0.0)}


def _head_gradient(model, data) -> np.ndarray:
    """The read-out's output gradient on the first batch, (tokens, 16): d(mean cross-entropy)
    / d(scores) = (softmax - onehot) / tokens, from the scores bf16-mixed computes."""
    with use_policy("bf16-mixed"), no_grad():
        scores = backend.to_numpy(model(data.x[:BATCH]).data)
    scores = scores.reshape(-1, VOCAB).astype(np.float64)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(p)), data.y[:BATCH].reshape(-1)] -= 1.0
    return (p / len(p)).astype(np.float32)


def rounding_bias(gradient: np.ndarray) -> dict:
    """NVFP4 (1x16 blocks) of ``gradient`` to nearest even and stochastically: for each, the
    share of the nonzero values flushed, and how much of the gradient's positive part (the
    push down on the tokens that were not next) survives, sum(q[g > 0]) / sum(g[g > 0])
    (1 for an unbiased cast, in expectation)."""
    device = backend.asarray(np.ascontiguousarray(gradient), xp.float32)
    positive, nonzero = gradient > 0, int(np.count_nonzero(gradient))
    out = {}
    # each cast's nvfp4_quantize keywords (a mode, a seed, an offset)
    casts: tuple[tuple[str, dict[str, Any]], ...] = (
        ("nearest_even", {}), ("stochastic", {"mode": "stochastic", "seed": 0, "offset": 0}))
    for label, options in casts:
        q = nvfp4_quantize(device, **options)
        values = backend.to_numpy(nvfp4_dequantize(q)).astype(np.float64)
        out[label] = {"flushed": q.flushed / nonzero,
                      "positive_part_kept": float(values[positive].sum()
                                                  / gradient[positive].astype(np.float64).sum())}
    return out


@register("fp4", TITLE)
def run(ctx: Context) -> Result:
    steps = 10 if ctx.quick else 40
    tail = max(1, steps // 10)
    data = markov_source()
    results, models = {}, {}
    for label, policy in RUNS.items():
        ctx.progress(f"  {label}, {steps} steps")
        models[label], results[label] = _train(policy, steps, data)
    reference = [float(v) for v in results[REFERENCE].losses]
    runs = {label: _run_numbers(RUNS[label], result, reference, tail)
            for label, result in results.items()}
    rounding = rounding_bias(_head_gradient(models[REFERENCE], data))
    numbers = {"model": MODEL, "steps": steps, "optimizer": f"Adam lr {LR} eps {EPS:g}",
               "batch": BATCH, "tokens_per_batch": BATCH * LENGTH, "separates": SEPARATES,
               "runs": runs, "head_gradient_rounding": rounding}
    figures = plot_fp4(runs, REFERENCE, CASTS, rounding, ctx.out / "fp4")
    return Result("fp4", TITLE, numbers, [f.name for f in figures], summary(numbers))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x == 0 or x >= 0.01 else f"{100 * x:.2g}%"


def _ratio(run: dict, base: dict) -> float:
    return run["typical_gap_to_bf16"] / base["typical_gap_to_bf16"]


def summary(n: dict) -> str:
    """The paragraph of ``summary.md``, every claim read from ``n``."""
    runs = n["runs"]
    base, bf16 = runs[NVFP4], runs[REFERENCE]
    switched = [label for label in RUNS if label not in (REFERENCE, NVFP4, "MXFP4")]
    matter = [label for label in switched if _ratio(runs[label], base) >= SEPARATES]
    gaps = "; ".join(f"{label} {runs[label]['typical_gap_to_bf16']:.4f} "
                     f"({_ratio(runs[label], base):.1f}x)" for label in switched)
    text = (
        f"{n['model']} on the language models' Markov source, Adam "
        f"(lr {n['optimizer'].split()[2]}), {n['steps']} steps of {n['batch']} sequences "
        f"({n['tokens_per_batch']} tokens) from the same weights on the same batches. "
        f"bf16-mixed ends at {bf16['final_loss']:.4f}, NVFP4 (`nvfp4:keep=head`: the read-out "
        f"in bf16, as the NVFP4 paper keeps its last layers) at {base['final_loss']:.4f}, its "
        f"typical gap to bf16 {base['typical_gap_to_bf16']:.4f} (median distance of the "
        f"10-step means). With ingredients off, the gap (and its ratio to NVFP4's): "
        f"{gaps}; MXFP4 {runs['MXFP4']['typical_gap_to_bf16']:.4f} "
        f"({_ratio(runs['MXFP4'], base):.1f}x). ")
    text += _which_matter(matter, switched)
    text += _head(runs, n["head_gradient_rounding"])
    text += _transform_and_tiles(n)
    text += _mx(runs, base)
    return text


def _which_matter(matter: list, switched: list) -> str:
    alone = [label for label in matter if label != "every ingredient off"]
    if not alone:
        return (f"No single ingredient moves the loss to {SEPARATES:g} times NVFP4's own gap "
                f"at this size; only all of them off together do. " if matter else
                f"Nothing moves the loss to {SEPARATES:g} times NVFP4's own gap at this "
                f"size, not even all ingredients off. ")
    rest = [label for label in switched if label not in matter]
    return (f"At this size only {_named(alone)} moves the loss to {SEPARATES:g} times "
            f"NVFP4's own gap or more; {_named(rest) or 'nothing else'} stay below. ")


def _named(labels: list) -> str:
    return ", ".join(f"'{label}'" for label in labels)


def _head(runs: dict, rounding: dict) -> str:
    head = runs["read-out in FP4 too"]["flushed_by_role_in_head"]
    rne, sr = rounding["nearest_even"], rounding["stochastic"]
    sr_on = runs[NVFP4]["flushed_by_role_in_block"]
    sr_off = runs["no stochastic rounding"]["flushed_by_role_in_block"]
    kept = _ratio(runs["read-out in FP4 too"], runs[NVFP4]) >= SEPARATES
    return (
        ("The statistics say why the read-out is the layer to keep: " if kept else
         "Keeping the read-out in bf16 does not matter here, though its cast is the worst: ")
        + f"its output gradient, "
        f"(softmax - onehot) / tokens, holds in each row of {VOCAB} (one 1x16 block) one "
        f"large value, p - 1 for the next token, beside {VOCAB - 1} small probabilities, so "
        f"the block's scale is set by the large one and, cast to FP4, "
        f"{_pct(head['grad_output'])} of its nonzero values flushed to zero over the run "
        f"(the block's own output-gradient casts: {_pct(sr_on['grad_output'])}). "
        f"Stochastic rounding is what keeps such a cast unbiased: on one batch's read-out "
        f"gradient, nearest even flushes {_pct(rne['flushed'])} of the nonzero values and keeps "
        f"{_pct(rne['positive_part_kept'])} of the positive part (the push down on the "
        f"tokens that did not come next), stochastic rounding flushes about as many "
        f"({_pct(sr['flushed'])}) but rounds others up in proportion and keeps "
        f"{_pct(sr['positive_part_kept'])} (one draw; 100% in expectation). The flushed "
        f"fractions in fp8.jsonl cannot show this bias (in the block's output-gradient "
        f"casts {_pct(sr_off['grad_output'])} nearest even against {_pct(sr_on['grad_output'])} "
        f"stochastic), only such a sum can. In the block, whose output-gradient casts flush "
        f"far fewer values, switching it off takes the loss "
        f"{_ratio(runs['no stochastic rounding'], runs[NVFP4]):.1f} times as far from "
        f"bf16's. ")


def _transform_and_tiles(n: dict) -> str:
    runs = n["runs"]
    on = runs[NVFP4]["flushed_by_role_in_block"]
    rht = runs["no Hadamard transform"]["flushed_by_role_in_block"]
    tiles = runs["1x16 weight blocks"]["flushed_by_role_in_block"]
    shown = _ratio(runs["no Hadamard transform"], runs[NVFP4]) >= SEPARATES
    loss = ("and the loss shows it. " if shown else
            f"yet the loss does not show it in {n['steps']} steps of a one-block model, where "
            f"each weight gradient sums {n['tokens_per_batch']} tokens and the values "
            f"flushed are the blocks' smallest. ")
    tiles_matter = _ratio(runs["1x16 weight blocks"], runs[NVFP4]) >= SEPARATES
    return (
        f"The Hadamard transform does what it is for: without it the wgrad casts flush "
        f"{_pct(rht['wgrad_grad_output'])} of the gradient's and {_pct(rht['wgrad_input'])} "
        f"of the activation's values (with it: {_pct(on['wgrad_grad_output'])} and "
        f"{_pct(on['wgrad_input'])}), mixing 16 tokens spreading a block's largest value over "
        f"all 16, " + loss +
        f"16x16 weight tiles flush more of the weights than 1x16 blocks "
        f"({_pct(on['weight'])} against {_pct(tiles['weight'])}: one scale spans 16 rows); "
        f"what they buy is the same quantized weight in forward and dgrad (1x16 blocks are "
        f"cast again along the other axis), "
        + ("which matters here. " if tiles_matter else
           "which this model does not need to stay near bf16. "))


def _mx(runs: dict, base: dict) -> str:
    mx, on = runs["MXFP4"]["flushed_by_role_in_block"], base["flushed_by_role_in_block"]
    return (
        f"MXFP4 (32-value blocks, power-of-two E8M0 scales, nearest even everywhere) flushes "
        f"more than NVFP4: {_pct(mx['input'])} of the inputs and {_pct(mx['grad_output'])} of "
        f"the output gradients, against {_pct(on['input'])} and {_pct(on['grad_output'])}. "
        f"At most {_pct(max(r['max_saturated'] for r in runs.values()))} of any cast's "
        f"values saturated in any run (an E4M3-rounded block scale can put a block's largest "
        f"value just past 6).")
