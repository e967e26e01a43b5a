"""Layers on the autograd engine: ``Module`` (named parameters, state dicts), ``Linear``,
``Embedding``, ``LSTM``, ``ModuleList``, ``Sequential``, activations, the ``MLP`` builder,
image layers (``Conv2d``, ``MaxPool2d``, ``AvgPool2d``, ``Flatten``: ``conv.py``),
``LayerNorm``, ``BatchNorm2d`` (``norm.py``), ``Dropout``,
``MultiheadAttention``, ``TransformerBlock``, ``causal_mask`` (``attention.py``),
``from_torch`` (the same model from a ``torch.nn.Module``) and seeded initialisers
(``fpsim.nn.init``).

>>> from fpsim import nn
>>> model = nn.MLP([2, 3, 1], activation="tanh", rng=7)
>>> sorted(model.state_dict())
['0.bias', '0.weight', '2.bias', '2.weight']
"""
from . import init
from .layers import (ACTIVATIONS, GELU, MLP, Dropout, Embedding, Linear, ModuleList, ReLU,
                     Sequential, Sigmoid, SiLU, Tanh)
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d
from .lstm import LSTM
from .module import Module, parameter
from .norm import BatchNorm2d, LayerNorm
from .attention import MultiheadAttention, TransformerBlock, causal_mask
from .from_torch import from_torch

__all__ = ["Module", "parameter", "Linear", "Embedding", "LSTM", "ModuleList", "Sequential",
           "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "MLP", "ACTIVATIONS", "Conv2d",
           "MaxPool2d", "AvgPool2d", "Flatten", "LayerNorm", "BatchNorm2d", "Dropout",
           "MultiheadAttention", "TransformerBlock", "causal_mask", "from_torch", "init"]
