"""What each precision string means as a training recipe: besides the formats the policy gives
each op (``fpsim.autograd.get_policy``), whether the optimizer keeps a master copy of the
weights and which loss scaler runs, as the framework that named the string does.

Lightning (``Trainer(precision=...)``, ``lightning.fabric.plugins.precision``):

=============  =======  =======  ================================  ============================
string         storage  compute  master copy                       loss scaler
=============  =======  =======  ================================  ============================
32-true        fp32     fp32     none (the weights are fp32)       none
16-mixed       fp32     fp16     fp32 (the fp32 weights autocast   dynamic (torch GradScaler:
                                 casts from)                       2^16, x2 per 2000 clean
                                                                   steps, /2 on overflow)
bf16-mixed     fp32     bf16     fp32 (as 16-mixed)                none
16-true        fp16     fp16     none (``HalfPrecision``)          none
bf16-true      bf16     bf16     none (``HalfPrecision``)          none
64-true        fp64     fp64     none                              none
=============  =======  =======  ================================  ============================

jmp-style strings (``params=...,compute=...,output=...``) keep the parameters in ``params``
and update them there (no separate master copy) without loss scaling, jmp's
``NoOpLossScale`` default; give ``scaler=``/``--scaler`` to add one.

>>> recipe_for("16-true")
Recipe(policy='16-true', storage='fp16', compute='fp16', master=None, scaler='none')
>>> recipe_for("16-mixed").scaler
'dynamic'
"""
from __future__ import annotations

from typing import NamedTuple

from ..autograd import get_policy
from ..scaling import NoScaler, StaticScaler, preset

__all__ = ["Recipe", "recipe_for", "RECIPE_DEFAULTS", "scaler_name", "recipe_record"]

# policy name -> (master copy format or None, scaler as resolve_scaler takes it)
RECIPE_DEFAULTS = {
    "32-true": (None, "none"),
    "16-mixed": ("fp32", "dynamic"),
    "bf16-mixed": ("fp32", "none"),
    "16-true": (None, "none"),
    "bf16-true": (None, "none"),
    "64-true": (None, "none"),
}


class Recipe(NamedTuple):
    """A precision string's defaults: ``storage`` (the parameters' format), ``compute``
    (matmuls'), ``master`` (the optimizer's master-copy format, or None) and ``scaler``."""

    policy: str
    storage: str
    compute: str
    master: str | None
    scaler: str


def recipe_for(policy) -> Recipe:
    """The recipe a precision string (or ``Policy``) names; see the module table."""
    resolved = get_policy(policy)
    base = resolved.name.split("+")[0]  # Policy.replace names a variant "16-mixed+grad"
    master, scaler = RECIPE_DEFAULTS.get(base, (None, "none"))
    if resolved.fp8 is not None:        # FP8 recipes run bf16-mixed around their GEMMs
        master, scaler = RECIPE_DEFAULTS["bf16-mixed"]
    compute = resolved.matmul if resolved.matmul is not None else resolved.param
    return Recipe(resolved.name, resolved.param.name, compute.name, master, scaler)


def scaler_name(config) -> str:
    """A scaler configuration's short name: ``none``, ``static:128``, ``dynamic`` (torch's
    GradScaler as ``--scaler dynamic`` builds it), a preset's name, or ``NAME (custom)``
    for a preset with changed parameters."""
    if isinstance(config, NoScaler):
        return "none"
    if isinstance(config, StaticScaler):
        return f"static:{config.scale:g}"
    name = getattr(config, "name", type(config).__name__)
    try:
        if config == preset(name):
            return "dynamic" if name == "torch" else name
    except (ValueError, TypeError):
        pass
    return f"{name} (custom)"


def recipe_record(recipe: Recipe, master_fmt, scaler_config) -> dict:
    """``run.json``'s account of the recipe: ``recipe`` (its defaults) and ``overrides`` (each
    default this run changed, name -> the value used), so a reader sees what differs."""
    used = {"master": str(master_fmt) if master_fmt is not None else None,
            "scaler": scaler_name(scaler_config)}
    defaults = {"master": recipe.master, "scaler": recipe.scaler}
    return {"recipe": defaults,
            "overrides": {key: value for key, value in used.items() if value != defaults[key]}}
