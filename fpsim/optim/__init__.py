"""Optimizers with master weights: ``Optimizer(params, rule, master="fp32")`` with the rules
``SGD``, ``Adam`` and ``AdamW``; ``Arith`` is the rounded arithmetic they compute with;
``apply_updates`` writes a step's new values into the weights; learning-rate schedules are in
``fpsim.optim.schedules``."""
from .arith import Arith
from ..exact import global_norm
from .optimizer import Optimizer, StepReport
from .rules import SGD, Adam, AdamW, Update
from .updates import apply_updates

__all__ = ["Optimizer", "StepReport", "global_norm", "SGD", "Adam", "AdamW", "Update", "Arith",
           "apply_updates"]
