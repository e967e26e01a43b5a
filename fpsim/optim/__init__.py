"""Optimizers with master weights: ``Optimizer(params, rule, master="fp32")`` with the rules
``SGD``, ``Adam`` and ``AdamW``; ``Arith`` is the rounded arithmetic they compute with."""
from .arith import Arith
from ..exact import global_norm
from .optimizer import Optimizer, StepReport
from .rules import SGD, Adam, AdamW, Update

__all__ = ["Optimizer", "StepReport", "global_norm", "SGD", "Adam", "AdamW", "Update", "Arith"]
