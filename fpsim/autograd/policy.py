"""Precision policies: which format each kind of op computes in, autocast style.

A ``Policy`` names a format for each op *category*; an op whose category has a format casts its
floating inputs to that format (a recorded cast, with a backward) and rounds its output to it;
a category set to ``None`` *promotes*: the op runs in the widest format among its inputs
(``numerics.widest``), as PyTorch's type promotion does.

The categories mirror the op lists of PyTorch autocast ("Automatic Mixed Precision package -
torch.amp", section "Autocast Op Reference", lists "CUDA Ops that can autocast to float16" and
"CUDA Ops that can autocast to float32"; https://pytorch.org/docs/stable/amp.html):

``matmul``       the float16 list: ``matmul``, ``mm``, ``linear``, ``conv2d``, ``LSTMCell``...
                 Here: ``matmul``, ``linear`` (and so the gate products of ``nn.LSTM``),
                 ``conv2d``.
``wide``         the float32 list: ``exp``, ``log``, ``pow``, ``sum``, ``softmax``,
                 ``log_softmax``, ``layer_norm``, norms. Here: ``exp``, ``log``, ``pow``,
                 ``sum``, ``softmax``, ``log_softmax``, ``layer_norm``.
``loss``         the losses on the float32 list: ``cross_entropy``, ``mse_loss``.
``elementwise``  everything on neither list: add, sub, mul, div, neg, sqrt, tanh, sigmoid,
                 relu, gelu, silu, max, mean, max_pool2d, avg_pool2d, concatenate,
                 stack, where, masked_fill, dropout, batch_norm (its output
                 keeps x's format; ``ops_norm``). ``mean`` is on neither list, so
                 under "16-mixed" the mean of an fp16 tensor is fp16 (summed in the
                 accumulation format, divided, rounded once), as in PyTorch.

Shape ops (reshape, transpose, indexing) never round and keep their input's format.

Besides the categories: ``param`` (the format ``nn`` creates parameters in), ``input`` (tensors made
from user data), ``fp8`` (``None``, or an FP8 recipe, ``fpsim.quant.recipe``: every ``linear`` then
quantizes its operands, ``ops_fp8``), ``grad`` (``None``: a tensor's gradient is stored in the
tensor's own format, as in every framework; a format: every gradient is stored in it, as FP8 recipes
store gradients in E5M2), and ``accumulation`` (the default dot-product/sum model of ``matmul``,
``linear`` and sums; ``fpsim.exact.accumulation``).

Policies from the strings users already type:

- Lightning ``precision=``: ``"32-true"`` (also ``"32"``, ``32``), ``"16-mixed"`` (``"16"``),
  ``"bf16-mixed"`` (``"bf16"``), ``"16-true"``, ``"bf16-true"``, ``"64-true"`` (``"64"``: the
  float64 reference mode, no rounding).
- FP8 recipes (``fpsim.quant.recipe``): ``"fp8-current"``, ``"fp8-delayed:history=16"``,
  ``"mxfp8"``, ``"fp8-block"``: ``bf16-mixed`` with every ``linear`` in FP8, as Transformer
  Engine runs under ``autocast(bf16)`` and an FP8 recipe; likewise the FP4 and FP6 recipes
  ``"nvfp4"``, ``"mxfp4"``, ``"mxfp6"``.
- jmp (deepmind/jmp ``get_policy``): ``"params=fp32,compute=fp16,output=fp32"``, short keys
  ``p=,c=,o=``, any name ``fpsim.formats.get`` knows; optional extra keys ``grad=`` and
  ``accumulation=``. jmp casts parameters and inputs to the compute format and runs everything
  there, so every category is ``compute`` except ``loss``, which is ``output``.

>>> p = get_policy("16-mixed")
>>> p.param.name, p.matmul.name, p.wide.name, p.elementwise
('fp32', 'fp16', 'fp32', None)
>>> get_policy("params=float32,compute=bf16,output=float32").elementwise.name
'bf16'
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..formats import BF16, FP16, FP32, Format
from ..grammar import split_options
from ..exact.accumulation import ExactAccumulation, get_accumulation
from ..quant.recipe import get_recipe, is_recipe_string
from .numerics import FP64, Float64Reference, resolve

__all__ = ["Policy", "get_policy", "PRESETS", "CATEGORIES"]

CATEGORIES = ("matmul", "wide", "loss", "elementwise")


@dataclass(frozen=True)
class Policy:
    """The formats an engine run uses; see the module doc. Frozen: ``replace()`` gives a new one.

    ``param``, ``input``: formats (never ``None``). ``matmul``, ``wide``, ``loss``,
    ``elementwise``: a format, or ``None`` to promote. ``grad``: ``None`` (own format) or a
    format. ``accumulation``: an ``Accumulation`` or a string ``get_accumulation`` accepts.
    """

    param: object = FP32
    input: object = FP32
    matmul: object = FP32
    wide: object = FP32
    loss: object = FP32
    elementwise: object = None
    grad: object = None
    accumulation: object = field(default_factory=ExactAccumulation)
    fp8: object = None
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("param", "input"):
            object.__setattr__(self, key, _format(key, getattr(self, key), optional=False))
        for key in CATEGORIES + ("grad",):
            object.__setattr__(self, key, _format(key, getattr(self, key), optional=True))
        object.__setattr__(self, "accumulation", get_accumulation(self.accumulation))
        if self.fp8 is not None:
            object.__setattr__(self, "fp8", get_recipe(self.fp8))

    def replace(self, **changes) -> "Policy":
        """A copy with some fields changed, e.g. ``get_policy("16-mixed").replace(grad="e5m2")``."""
        changes.setdefault("name", f"{self.name}+" + ",".join(sorted(changes)))
        return dataclasses.replace(self, **changes)

    @property
    def reference(self) -> bool:
        """True for the float64 reference mode (``"64-true"``)."""
        return self.param is FP64

    def __str__(self) -> str:
        return self.name


def _format(key, value, *, optional):
    if value is None:
        if optional:
            return None
        raise ValueError(f"policy field {key!r} needs a format, got None")
    if isinstance(value, (Format, Float64Reference, str)):
        try:
            return resolve(value)
        except ValueError as err:
            raise ValueError(f"policy field {key!r}: {err}") from None
    raise TypeError(f"policy field {key!r} takes a Format or a format name, "
                    f"got {type(value).__name__}")


def _true(fmt, name):
    return Policy(param=fmt, input=fmt, matmul=fmt, wide=None, loss=None, elementwise=None,
                  name=name)


def _mixed(low, name):
    return Policy(param=FP32, input=FP32, matmul=low, wide=FP32, loss=FP32, elementwise=None,
                  name=name)


PRESETS = {
    "32-true": Policy(name="32-true"),
    "16-mixed": _mixed(FP16, "16-mixed"),
    "bf16-mixed": _mixed(BF16, "bf16-mixed"),
    "16-true": _true(FP16, "16-true"),
    "bf16-true": _true(BF16, "bf16-true"),
    "64-true": Policy(param=FP64, input=FP64, matmul=FP64, wide=FP64, loss=FP64,
                      elementwise=FP64, name="64-true"),
}
_SHORT = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
_JMP_KEYS = {"params": "params", "param": "params", "p": "params", "compute": "compute",
             "c": "compute", "output": "output", "o": "output", "grad": "grad",
             "grads": "grad", "g": "grad", "accumulation": "accumulation", "acc": "accumulation"}

ACCEPTED = ('Lightning strings "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", '
            '"64-true" (or 32, 16, "bf16", 64), FP8 recipes "fp8-current", "fp8-delayed", '
            '"mxfp8", "fp8-block", FP4/FP6 recipes "nvfp4", "mxfp4", "mxfp6" (with optional '
            '":key=value,..."), or jmp style '
            '"params=fp32,compute=fp16,output=fp32" (keys params|p, compute|c, output|o, '
            'optional grad=, accumulation=; values: fpsim format names)')


def get_policy(spec) -> Policy:
    """A ``Policy`` from a preset name, a jmp-style string, or a ``Policy`` (returned as is).

    Invalid input raises ``ValueError`` showing the accepted forms.
    """
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = str(spec)
    if not isinstance(spec, str):
        raise TypeError(f"a policy is a Policy or a string ({ACCEPTED}); "
                        f"got {type(spec).__name__}")
    key = spec.strip().lower()
    key = _SHORT.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    if is_recipe_string(key):
        return dataclasses.replace(PRESETS["bf16-mixed"], fp8=get_recipe(spec),
                                   name=spec.strip())
    if "=" in key:
        return _parse_jmp(spec)
    raise ValueError(f"unknown precision policy {spec!r}; accepted: {ACCEPTED}")


def _parse_jmp(spec: str) -> Policy:
    """A jmp-style string: ``key=value,...`` of ``fpsim.grammar`` with no head."""
    _, pairs = split_options(spec, "policy", headless=True)
    fields = {}
    for key, value in pairs.items():
        name = _JMP_KEYS.get(key)
        if name is None:
            raise ValueError(f"bad policy part {key + '=' + value!r} in {spec!r}; "
                             f"accepted: {ACCEPTED}")
        if name in fields:
            raise ValueError(f"policy {spec!r} sets {name!r} twice")
        fields[name] = value
    missing = {"params", "compute", "output"} - set(fields)
    if missing:
        raise ValueError(f"policy {spec!r} lacks {', '.join(sorted(missing))}; "
                         f"accepted: {ACCEPTED}")
    try:
        params, compute, output = (resolve(fields[k]) for k in ("params", "compute", "output"))
        grad = resolve(fields["grad"]) if "grad" in fields else None
        accumulation = get_accumulation(fields.get("accumulation", ExactAccumulation()))
    except ValueError as err:
        raise ValueError(f"policy {spec!r}: {err}") from None
    return Policy(param=params, input=compute, matmul=compute, wide=compute, loss=output,
                  elementwise=compute, grad=grad, accumulation=accumulation,
                  name=spec.strip())
