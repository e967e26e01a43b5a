"""FP8 training recipes as strings: which scaling, which formats, which parameters.

A recipe says how the operands of every ``linear`` (the GEMMs Transformer Engine's ``Linear``
runs in FP8) are quantized; the rest of the model runs as ``bf16-mixed`` (fp32 weights and
master copy, bf16 GEMM outputs, fp32 reductions), as TE runs under ``autocast(bf16)``.

=================  ==========================================  ==============================
string             Transformer Engine recipe                   parameters (``key=value``)
=================  ==========================================  ==============================
``fp8-current``    ``Float8CurrentScaling``                    ``format``, ``power2``,
                                                               ``epsilon``
``fp8-delayed``    ``DelayedScaling``                          ``format``, ``history``
                                                               (``amax_history_len``, TE's
                                                               default 1024), ``margin``,
                                                               ``algo`` (``max`` or
                                                               ``most_recent``)
``mxfp8``          ``MXFP8BlockScaling`` (32-element blocks,   ``format`` (default ``e4m3``)
                   e8m0 scales)
``fp8-block``      ``Float8BlockScaling`` (1x128 activations   ``format`` (default ``e4m3``)
                   and gradients, 128x128 weights)
``nvfp4``          ``NVFP4BlockScaling`` (FP4 E2M1 in 1x16     ``rht``, ``sr``, ``2d`` (each
                   blocks, E4M3 block scales, FP32 tensor      1 or 0, default 1)
                   scale; 16x16 weight tiles)
``mxfp4``          MX with FP4 E2M1 elements (32-element
                   blocks, e8m0 scales, TE's RCEIL rule)
``mxfp6``          MX with FP6 elements (as ``mxfp4``)         ``format`` (``e3m2``, the
                                                               default, or ``e2m3``)
=================  ==========================================  ==============================

``format``: ``hybrid`` (e4m3fn forward, e5m2 for gradients; TE's default for the per-tensor
recipes) or ``e4m3`` (e4m3fn everywhere). Every recipe also takes ``acc=`` (the GEMMs'
accumulation model, any string ``fpsim.exact.accumulation.get_accumulation`` accepts; default
``exact``: each dot product exact, rounded once to fp32) and ``keep=`` (module names joined by
``+``, e.g. ``keep=2`` or ``keep=head+blocks.3``: those modules' GEMMs stay out of the recipe,
in the policy's bf16, as ``nn.Linear(..., fp8=False)`` keeps one; ``fpsim.train`` applies it by
name and refuses a name the model does not have).

``nvfp4``'s keys switch off TE's three ingredients (its ``disable_rht``,
``disable_stochastic_rounding``, ``disable_2d_quantization``): ``rht=0`` no random Hadamard
transform on the weight-gradient GEMM's inputs, ``sr=0`` gradients rounded to nearest even
instead of stochastically, ``2d=0`` weights in 1x16 blocks instead of 16x16 tiles.
``mxfp6`` defaults to E3M2: its three exponent bits span 2**-4 to 28 within a block, against
E2M3's 2**-3 to 7.5, and a gradient block's values spread over more binades than its extra
mantissa bit would serve (E2M3 suits casts of smooth weights and activations: ``format=e2m3``).

>>> recipe = get_recipe("fp8-delayed:history=16,margin=1")
>>> recipe.scaling.value, recipe.history, recipe.margin, recipe.forward.name, recipe.backward.name
('delayed', 16, 1, 'e4m3fn', 'e5m2')
>>> get_recipe("fp8-delayed:histroy=16")  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
ValueError: FP8 recipe 'fp8-delayed:histroy=16': unknown key 'histroy' (did you mean 'history'?);
fp8-delayed takes format, history, margin, algo, acc, keep
"""
from __future__ import annotations

import difflib
import enum
import re
from dataclasses import dataclass, field, fields

from ..grammar import split_options
from ..exact.accumulation import Accumulation, ExactAccumulation, get_accumulation
from ..formats import E2M1, E2M3, E3M2, E4M3FN, E5M2, Format
from ..options import check_choice, check_count_between, check_flag, check_float32
from .tensor_scaling import FLT_MAX, AmaxAlgorithm

__all__ = ["ScalingKind", "Fp8Recipe", "get_recipe", "is_recipe_string", "RECIPE_KINDS"]


# The amax history is a tuple every quantized tensor rolls once a step (about 0.4 ms a tensor
# at TE's default 1024, 5 ms at 2**14) and a checkpoint stores whole: 16 times TE's default
# is generous (a window longer than the run is the whole run) and still quick.
MAX_HISTORY = 2 ** 14
# The scale is fl32(fl32(fp8_max * 2**-margin) / amax). Up to 8, every finite amax (up to
# float32's largest, 2**128) gives e4m3fn (max 448) a scale > 0 whose inverse, which
# dequantizes, is finite too; at 9 an amax near 2**128 makes that inverse overflow to inf
# (the cast's values come back inf or NaN), and from 150 on 2**-margin is 0 in float32, so
# every scale is 0 and its inverse a division by zero.
MAX_MARGIN = 8
# epsilon floors the amax as a C float: beyond float32's largest it cannot be one
MAX_EPSILON = FLT_MAX


class ScalingKind(str, enum.Enum):
    """Where a quantized tensor's scale comes from."""

    CURRENT = "current"
    DELAYED = "delayed"
    MX = "mx"
    BLOCK = "block"
    NVFP4 = "nvfp4"


# What each kind uses beyond the formats, accumulation and keep (which every kind takes): the
# settings its Transformer Engine recipe has, as the engine (autograd/ops_fp8.py) reads them.
# Any other setting must keep its default, so that two recipes that compute alike are equal.
KIND_SETTINGS = {
    ScalingKind.CURRENT: ("power_2", "epsilon"),
    ScalingKind.DELAYED: ("history", "margin", "algorithm"),
    ScalingKind.MX: (),
    ScalingKind.BLOCK: ("epsilon",),
    ScalingKind.NVFP4: ("rht", "stochastic", "tiles_2d"),
}
_HYBRID, _E4M3 = (E4M3FN, E5M2), (E4M3FN, E4M3FN)
# (forward, backward) pairs each kind takes: FP4 and FP6 use one format for every operand
KIND_FORMATS = {
    ScalingKind.CURRENT: (_HYBRID, _E4M3), ScalingKind.DELAYED: (_HYBRID, _E4M3),
    ScalingKind.MX: (_E4M3, _HYBRID, (E2M1, E2M1), (E3M2, E3M2), (E2M3, E2M3)),
    ScalingKind.BLOCK: (_E4M3, _HYBRID), ScalingKind.NVFP4: ((E2M1, E2M1),),
}
# the formats and power_2 a kind takes when they are left None: TE's defaults (fp8-block's
# power-of-two scales, TE's use_f32_scales=False, are fixed: the engine's block GEMMs rely on
# exact power-of-two dequantization)
KIND_DEFAULTS = {kind: {"forward": pairs[0][0], "backward": pairs[0][1],
                        "power_2": kind is ScalingKind.BLOCK}
                 for kind, pairs in KIND_FORMATS.items()}
_COMMON = ("forward", "backward", "accumulation", "keep")


@dataclass(frozen=True)
class Fp8Recipe:
    """A recipe (module doc), checked when built, from a string or in Python alike: each
    setting's type and range, then its kind's rules (``KIND_SETTINGS``: a setting the kind
    does not use keeps its default, and the formats are a pair the kind takes). ``forward``:
    the format of inputs and weights; ``backward``: of output gradients; ``forward``,
    ``backward`` and ``power_2`` left None take the kind's default (``KIND_DEFAULTS``).

    >>> Fp8Recipe(ScalingKind.MX, history=5)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ValueError: history is not a setting of mx scaling (it takes forward, backward, accumulation,
    keep; history stays 1024), got history=5
    """

    scaling: ScalingKind
    forward: Format | None = None
    backward: Format | None = None
    history: int = 1024
    margin: int = 0
    algorithm: AmaxAlgorithm = AmaxAlgorithm.MAX
    power_2: bool | None = None
    epsilon: float = 0.0
    accumulation: Accumulation = field(default_factory=ExactAccumulation)
    keep: tuple = ()
    rht: bool = True
    stochastic: bool = True
    tiles_2d: bool = True
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        """Every setting checked, numbers kept as Python's, then the kind's rules."""
        kind = ScalingKind(check_choice("scaling", self.scaling, tuple(ScalingKind)))
        defaults = KIND_DEFAULTS[kind]
        checked = {"scaling": kind,
                   "forward": _format("forward", self.forward, defaults["forward"]),
                   "backward": _format("backward", self.backward, defaults["backward"]),
                   "history": check_count_between("history", self.history, 1, MAX_HISTORY),
                   "margin": check_count_between("margin", self.margin, 0, MAX_MARGIN),
                   "algorithm": AmaxAlgorithm(check_choice("algorithm", self.algorithm,
                                                           tuple(AmaxAlgorithm))),
                   "power_2": check_flag("power_2", defaults["power_2"] if self.power_2 is None
                                         else self.power_2),
                   "epsilon": check_float32("epsilon", self.epsilon, 0.0, MAX_EPSILON),
                   "keep": _keep(self.keep),
                   "rht": check_flag("rht", self.rht),
                   "stochastic": check_flag("stochastic", self.stochastic),
                   "tiles_2d": check_flag("tiles_2d", self.tiles_2d)}
        if not isinstance(self.accumulation, Accumulation):
            raise TypeError(f"accumulation must be an Accumulation (get_accumulation('exact')),"
                            f" got {self.accumulation!r}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        _check_kind(self)

    def __str__(self) -> str:
        return self.name

    def record(self) -> dict:
        """Every setting, defaults included, as JSON values (``run.json``'s ``fp8``); the
        NVFP4 switches only for NVFP4 and ``keep`` only when set, so that the records (and
        the identities resumes check) of the FP8 recipes stay as they were."""
        record = {"recipe": self.name, "scaling": self.scaling.value,
                  "forward": self.forward.name, "backward": self.backward.name,
                  "history": self.history, "margin": self.margin,
                  "algorithm": self.algorithm.value, "power_2": self.power_2,
                  "epsilon": self.epsilon, "accumulation": str(self.accumulation)}
        if self.scaling is ScalingKind.NVFP4:
            record.update(rht=self.rht, stochastic=self.stochastic, tiles_2d=self.tiles_2d)
        if self.keep:
            record["keep"] = list(self.keep)
        return record


def _check_kind(recipe: Fp8Recipe) -> None:
    """Refuse a setting ``recipe``'s kind does not use (left at a value other than its
    default) and a pair of formats the kind does not take."""
    kind = recipe.scaling
    takes = (*_COMMON[:2], *KIND_SETTINGS[kind], *_COMMON[2:])
    for item in fields(recipe):
        if item.name in ("scaling", "name", *_COMMON, *KIND_SETTINGS[kind]):
            continue
        default = KIND_DEFAULTS[kind].get(item.name, item.default)
        value = getattr(recipe, item.name)
        if value != default:
            raise ValueError(f"{item.name} is not a setting of {kind.value} scaling (it takes "
                             f"{', '.join(takes)}; {item.name} stays {default!r}), got "
                             f"{item.name}={value!r}")
    pair = (recipe.forward, recipe.backward)
    if pair not in KIND_FORMATS[kind]:
        accepted = ", ".join(f"{f.name}/{b.name}" for f, b in KIND_FORMATS[kind])
        raise ValueError(f"{kind.value} scaling takes forward/backward formats {accepted}, "
                         f"got {pair[0].name}/{pair[1].name}")


def _format(name: str, value, default: Format) -> Format:
    if value is None:
        return default
    if not isinstance(value, Format):
        raise TypeError(f"{name} must be an FP8 Format (E4M3FN, E5M2) or an FP4/FP6 one "
                        f"(E2M1, E3M2, E2M3), got {value!r}")
    return value


# string prefix -> (kind, keys it takes, default format)
RECIPE_KINDS = {
    "fp8-current": (ScalingKind.CURRENT, ("format", "power2", "epsilon", "acc", "keep"),
                    "hybrid"),
    "fp8-delayed": (ScalingKind.DELAYED, ("format", "history", "margin", "algo", "acc",
                                          "keep"), "hybrid"),
    "mxfp8": (ScalingKind.MX, ("format", "acc", "keep"), "e4m3"),
    "fp8-block": (ScalingKind.BLOCK, ("format", "acc", "keep"), "e4m3"),
    "nvfp4": (ScalingKind.NVFP4, ("rht", "sr", "2d", "acc", "keep"), "fp4"),
    "mxfp4": (ScalingKind.MX, ("acc", "keep"), "fp4"),
    "mxfp6": (ScalingKind.MX, ("format", "acc", "keep"), "e3m2"),
}
_FORMATS = {"hybrid": (E4M3FN, E5M2), "e4m3": (E4M3FN, E4M3FN)}
# a kind's default format -> the formats it accepts; FP4 and FP6 use one for every operand
_FORMAT_CHOICES = {"hybrid": _FORMATS, "e4m3": _FORMATS, "fp4": {"fp4": (E2M1, E2M1)},
                   "e3m2": {"e3m2": (E3M2, E3M2), "e2m3": (E2M3, E2M3)}}
_SWITCHES = {"rht": "rht", "sr": "stochastic", "2d": "tiles_2d"}
_BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def is_recipe_string(spec) -> bool:
    """True for a string that names a recipe (``fp8-...``, ``mxfp8...``, ``nvfp4...``)."""
    return isinstance(spec, str) and spec.strip().lower().partition(":")[0] in RECIPE_KINDS


def get_recipe(spec) -> Fp8Recipe:
    """An ``Fp8Recipe`` from its string (module doc), or a recipe returned as is. The string
    is only split into typed values here; the recipe checks them as it checks any (its
    ``__post_init__``). Bad input raises ``ValueError`` naming what is accepted."""
    if isinstance(spec, Fp8Recipe):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"an FP8 recipe is a string such as 'fp8-delayed:history=16', got "
                        f"{type(spec).__name__}")
    key = spec.strip().partition(":")[0].strip().lower()
    if key not in RECIPE_KINDS:
        raise ValueError(f"unknown FP8 recipe {spec!r}; accepted: "
                         f"{', '.join(RECIPE_KINDS)} (each with optional ':key=value,...')")
    kind, keys, default_format = RECIPE_KINDS[key]
    values = _parse_pairs(spec, key, keys)
    try:
        return Fp8Recipe(kind, name=spec.strip(), **_settings(values, default_format))
    except ValueError as err:
        raise ValueError(f"{_label(key)} {spec!r}: {err}") from None


def _label(key: str) -> str:
    """What the errors call a recipe: by its elements' width."""
    return f"FP{next(c for c in key if c.isdigit())} recipe"


def _parse_pairs(spec: str, key: str, keys) -> dict:
    """The string's ``key=value`` pairs (``fpsim.grammar``), each key one the kind takes."""
    _, values = split_options(spec, _label(key))
    for name in values:
        if name not in keys:
            close = difflib.get_close_matches(name, keys, 1, 0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{_label(key)} {spec!r}: unknown key {name!r}{hint}; "
                             f"{key} takes {', '.join(keys)}")
    return values


def _settings(values: dict, default_format: str) -> dict:
    """The recipe's settings from the string's values, each read as its type (the words of
    the grammar: formats, switches, algorithms); their ranges are the recipe's to check."""
    fmt = values.get("format", default_format).lower()
    accepted = _FORMAT_CHOICES[default_format]
    if fmt not in accepted:
        raise ValueError(f"format must be one of {', '.join(accepted)}, got {fmt!r}")
    forward, backward = accepted[fmt]
    settings = {"forward": forward, "backward": backward}
    for key, name in _SWITCHES.items():
        if key in values:
            settings[name] = _boolean(key, values[key])
    if "keep" in values:
        settings["keep"] = tuple(values["keep"].split("+"))
    if "history" in values:
        settings["history"] = _integer("history", values["history"], 1, MAX_HISTORY)
    if "margin" in values:
        settings["margin"] = _integer("margin", values["margin"], 0, MAX_MARGIN)
    if "algo" in values:
        settings["algorithm"] = values["algo"].lower()
    if "power2" in values:
        settings["power_2"] = _boolean("power2", values["power2"])
    if "epsilon" in values:
        settings["epsilon"] = _number("epsilon", values["epsilon"])
    if "acc" in values:
        settings["accumulation"] = get_accumulation(values["acc"])
    return settings


def _boolean(name: str, text: str) -> bool:
    if text.lower() not in _BOOLEANS:
        raise ValueError(f"{name} must be 1 or 0 (true/false), got {text!r}")
    return _BOOLEANS[text.lower()]


def _keep(names, what: str = "keep") -> tuple:
    """Module names (``model.named_modules()``'s), each once; which exist is checked against
    the model (``fpsim.train``)."""
    if isinstance(names, str) or not isinstance(names, (tuple, list)):
        raise TypeError(f"{what} must be a tuple of module names, got {names!r}")
    names = tuple(names)
    bad = [n for n in names if not isinstance(n, str) or not re.fullmatch(r"[\w.]+", n)]
    if bad:
        raise ValueError(f"{what} takes module names (letters, digits, _ and ., joined by + "
                         f"in a recipe string), got {bad[0]!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{what} names {twice[0]!r} twice")
    return names


def _integer(name: str, text: str, low: int, high: int) -> int:
    """An integer's digits as an int (its range, ``low`` to ``high``, the recipe checks)."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {text!r}")
    return int(text)


def _number(name: str, text: str) -> float:
    """A number's digits as a float (its range the recipe checks)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
