"""Experiment: an LSTM language model on the generated Markov language (``_language``) under
seven precision recipes: the paper's bigLSTM question (does 16-mixed need a loss scale to
match fp32?) and the fine-tuning one (16-true against bf16-true), in miniature.

The network (``LSTMLanguageModel``): an embedding of the 16 tokens in 16 dimensions
(``nn.Embedding``, N(0, 1) as PyTorch), a one-layer LSTM with 16 hidden units
(``nn.LSTM``, PyTorch's parameterisation and initialisation) and a linear read-out to 16
scores per position; the loss is the mean cross-entropy over every predicted token.
"""
from __future__ import annotations

from .. import nn
from . import Context, Result, register
from ._language import RUNS, VOCAB, run_language_experiment

TITLE = "Language model (LSTM): the precision recipes on a language of known entropy"
EMBEDDING, HIDDEN, LR = 16, 16, 3e-2
MODEL = (f"An LSTM language model (embedding {VOCAB}x{EMBEDDING}, one LSTM layer of "
         f"{HIDDEN} units, linear read-out to {VOCAB} scores)")

__all__ = ["LSTMLanguageModel", "RUNS", "run"]


class LSTMLanguageModel(nn.Module):
    """Token ids (batch, length) -> next-token scores (batch, length, vocab)."""

    def __init__(self, vocab: int = VOCAB, embedding: int = EMBEDDING, hidden: int = HIDDEN,
                 seed: int = 0):
        super().__init__()
        rng = nn.init.as_rng(seed)
        self.embedding = nn.Embedding(vocab, embedding, rng=rng)
        self.lstm = nn.LSTM(embedding, hidden, rng=rng)
        self.head = nn.Linear(hidden, vocab, rng=rng)

    def forward(self, ids):
        outputs, _ = self.lstm(self.embedding(ids))
        return self.head(outputs)


@register("lstm_lm", TITLE)
def run(ctx: Context) -> Result:
    return run_language_experiment(ctx, "lstm_lm", TITLE, MODEL, LSTMLanguageModel, LR,
                                   "LSTM LM")
