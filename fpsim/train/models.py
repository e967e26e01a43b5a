"""Built-in models that take more than a list of sizes: ``TokenTransformer``, the model
``fpsim train --model transformer`` builds for token data.

>>> import numpy as np
>>> from fpsim.autograd import Tensor
>>> model = TokenTransformer(vocab=11, outputs=11, length=6, d_model=16, heads=2, blocks=1)
>>> model(np.zeros((3, 6), np.int64)).shape
(3, 6, 11)
"""
from __future__ import annotations

from .. import autograd as ag
from .. import nn
from ..backend import xp
from ..options import check_count

__all__ = ["TokenTransformer"]


class TokenTransformer(nn.Module):
    """A causal language-model-style network on token ids (batch, length): token and learned
    position embeddings (``nn.Embedding``), ``blocks`` pre-LN ``nn.TransformerBlock`` s with
    the causal mask (a position sees itself and those before it), a final ``nn.LayerNorm``
    and a ``nn.Linear`` read-out to ``outputs`` scores per position."""

    def __init__(self, vocab: int, outputs: int, length: int, *, d_model: int = 32,
                 heads: int = 4, blocks: int = 2, mlp_ratio: int = 4, dropout: float = 0.0,
                 seed: int = 0):
        super().__init__()
        for name, value in (("vocab", vocab), ("outputs", outputs), ("length", length),
                            ("d_model", d_model), ("heads", heads), ("blocks", blocks)):
            check_count(name, value, 1)
        self.length = length
        rng = nn.init.as_rng(seed)
        self.token = nn.Embedding(vocab, d_model, rng=rng)
        self.position = nn.Embedding(length, d_model, rng=rng)
        self.blocks = nn.ModuleList(nn.TransformerBlock(d_model, heads, mlp_ratio, dropout,
                                                        rng=rng, seed=seed + 4 * i)
                                    for i in range(blocks))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, outputs, rng=rng)

    def forward(self, ids):
        ids = xp.asarray(ids.data if isinstance(ids, ag.Tensor) else ids)
        length = ids.shape[-1]
        if length > self.length:
            raise ValueError(f"TokenTransformer: sequences of {length} tokens, longer than the "
                             f"{self.length} positions it was built for")
        x = self.token(ids) + self.position(xp.arange(length))
        mask = nn.causal_mask(length)
        for block in self.blocks:
            x = block(x, attn_mask=mask)
        return self.head(self.norm(x))
