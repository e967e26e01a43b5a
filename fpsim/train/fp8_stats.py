"""What an FP8 recipe's casts did, per quantized tensor and step (``fp8.jsonl``).

Under an FP8 recipe (``train(policy="fp8-delayed")``) every GEMM quantizes three tensors:
its ``input`` and ``weight`` in the forward pass and its ``grad_output`` in the backward
pass (``fpsim.autograd.ops_fp8``); under ``nvfp4`` also the weight-gradient GEMM's own casts
of the transformed input and gradient (``wgrad_input``, ``wgrad_grad_output``). GEMMs a
recipe's ``keep=`` holds in bf16 quantize nothing and are not listed. For each and each step
the run records:

- ``scale``: the scale of the step's last cast of the tensor (``nan``: not cast that step, or
  a recipe without a per-tensor scale: MX, 1x128 tiles); NVFP4's is its per-tensor encode
  scale ``2688 / amax``;
- ``saturated``: the fraction of the step's cast elements that saturation changed: their
  scaled magnitude rounds beyond the FP8 format's largest finite value, so they became +-max
  (the clipping delayed scaling risks when a tensor grows faster than its history);
- ``flushed``: the fraction of nonzero elements that became zero (underflow below the
  format's smallest subnormal: what too small a scale costs).

They go to ``fp8.jsonl`` beside the trace, JSON Lines in the layout of ``layers.jsonl``
(``layer_stats``): a header ``{"format": "fpsim-fp8-stats", "version": 1, "tensors":
[names]}`` (names ``<module>[.<site>].<role>``, e.g. ``"0.input"``), then one line per step
``{"step": k, "scale": [...], "saturated": [...], "flushed": [...]}``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..autograd.ops_fp8 import roles_of
from ..nn.gemm import named_gemm_slots
from .layer_stats import StepTable

__all__ = ["FP8_FILE", "FP8_TABLE", "Fp8Stats", "tensor_names", "collect"]

FP8_FILE = "fp8.jsonl"
ROLES = roles_of(None)


@dataclass(frozen=True)
class Fp8Stats:
    """One step's statistics, one value per quantized tensor in the run's order."""

    step: int
    scale: tuple
    saturated: tuple
    flushed: tuple


FP8_TABLE = StepTable(FP8_FILE, "fpsim-fp8-stats", 1, "tensors",
                      ("scale", "saturated", "flushed"), Fp8Stats,
                      "an fp8.jsonl of an fpsim run under an FP8 recipe")


def tensor_names(model, recipe=None) -> tuple:
    """The quantized tensors of every GEMM the model has run under ``recipe`` (default: the
    FP8 recipes' three per GEMM), in module order; kept GEMMs quantize none."""
    return tuple(f"{gemm}.{role}" if gemm else role
                 for gemm, slots in named_gemm_slots(model) if not slots.kept
                 for role in roles_of(recipe))


def collect(model, names: tuple, step: int) -> Fp8Stats:
    """The statistics of ``step`` from every GEMM's slots (each slot's counts restart)."""
    found = {}
    for gemm, slots in named_gemm_slots(model):
        for role, values in slots.take_stats().items():
            found[f"{gemm}.{role}" if gemm else role] = values
    missing = {"scale": math.nan, "saturated": math.nan, "flushed": math.nan}
    rows = [found.get(name, missing) for name in names]
    return Fp8Stats(step, *(tuple(row[key] for row in rows)
                            for key in ("scale", "saturated", "flushed")))
