"""Experiment: a tiny transformer language model on the generated Markov language
(``_language``) under seven precision recipes, beside the LSTM of ``lstm_lm``.

The network is ``fpsim.train.TokenTransformer`` (as ``fpsim train --model transformer``
builds it): token and learned position embeddings of width 16, one pre-LN transformer block
(two heads, causal mask, GELU MLP of width 64), a final LayerNorm and a linear read-out to 16
scores per position; the loss is the mean cross-entropy over every predicted token.
"""
from __future__ import annotations

from ..train.models import TokenTransformer
from . import Context, Result, register
from ._language import LENGTH, RUNS, VOCAB, run_language_experiment

TITLE = "Language model (transformer): the precision recipes on a language of known entropy"
WIDTH, HEADS, BLOCKS, LR = 16, 2, 1, 2e-2
MODEL = (f"A tiny transformer language model (token and position embeddings of width {WIDTH}, "
         f"{BLOCKS} pre-LN block with {HEADS} heads and the causal mask, LayerNorm, linear "
         f"read-out to {VOCAB} scores)")

__all__ = ["tiny_transformer", "RUNS", "run"]


def tiny_transformer() -> TokenTransformer:
    """The experiment's model, seed 0."""
    return TokenTransformer(VOCAB, VOCAB, LENGTH, d_model=WIDTH, heads=HEADS, blocks=BLOCKS,
                            seed=0)


@register("transformer_lm", TITLE)
def run(ctx: Context) -> Result:
    return run_language_experiment(ctx, "transformer_lm", TITLE, MODEL, tiny_transformer, LR,
                                   "Transformer LM")
