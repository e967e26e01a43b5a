"""Layers on the autograd engine: ``Module`` (named parameters, state dicts), ``Linear``,
``Embedding``, ``LSTM``, ``ModuleList``, ``Sequential``, activations (``ReLU``,
``LeakyReLU``, ``ELU``, ``Tanh``, ``Sigmoid``, ``GELU``, ``SiLU``, ``Softmax``,
``LogSoftmax``), the ``MLP`` builder, ``Identity``, image layers (``Conv1d``, ``Conv2d``,
``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d``, ``Flatten``, ``Unflatten``: ``conv.py``),
``LayerNorm``, ``GroupNorm``, ``BatchNorm2d`` (``norm.py``), ``Dropout``,
``MultiheadAttention``, ``TransformerBlock``, ``TransformerEncoder``, ``causal_mask``
(``attention.py``),
``from_torch`` (the same model from a ``torch.nn.Module``) and seeded initialisers
(``fpsim.nn.init``).

>>> from fpsim import nn
>>> model = nn.MLP([2, 3, 1], activation="tanh", rng=7)
>>> sorted(model.state_dict())
['0.bias', '0.weight', '2.bias', '2.weight']
"""
from . import init
from .layers import (ACTIVATIONS, ELU, GELU, MLP, Dropout, Embedding, Identity, LeakyReLU,
                     Linear, LogSoftmax, ModuleList, ReLU, Sequential, Sigmoid, SiLU, Softmax,
                     Tanh)
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, Flatten, MaxPool2d, Unflatten
from .lstm import LSTM
from .module import Module, parameter
from .norm import BatchNorm2d, GroupNorm, LayerNorm
from .attention import MultiheadAttention, TransformerBlock, TransformerEncoder, causal_mask
from .from_torch import from_torch

__all__ = ["Module", "parameter", "Linear", "Embedding", "LSTM", "ModuleList", "Sequential",
           "ReLU", "LeakyReLU", "ELU", "Tanh", "Sigmoid", "GELU", "SiLU", "Softmax",
           "LogSoftmax", "MLP", "ACTIVATIONS", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "Flatten", "Unflatten", "Identity", "LayerNorm", "GroupNorm",
           "BatchNorm2d", "Dropout",
           "MultiheadAttention", "TransformerBlock", "TransformerEncoder", "causal_mask",
           "from_torch", "init"]
