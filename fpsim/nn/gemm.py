"""The FP8/FP4 scaling state of the layers that run GEMMs, held by those layers only.

A layer whose forward runs a GEMM under the policy's FP8/FP4 recipe derives from
``GemmModule`` (not ``Module``) and hands each GEMM its state,
``scaling_slots=self.gemm_slots(site)`` ("" for a layer's only GEMM; ``LSTM`` names its two
"ih" and "hh", ``MultiheadAttention`` its projections, a traced model each matmul step).
``gemm_slots`` creates the state (an ``autograd.ScalingSlots``, TE's ``fp8_meta``) on first
use; once it holds a delayed-scaling history or a stochastic rounding counter, the layer's
``extra_state`` carries it (``{"fp8": {site: state}}``), which training checkpoints save.
Other modules hold no FP8 state at all. ``named_gemm_slots(model)`` lists every GEMM's state
in a model by dotted name (``"0"``, ``"blocks.1.attn.q"``).

>>> import numpy as np
>>> from fpsim import nn
>>> from fpsim.autograd import Tensor, use_policy
>>> model = nn.Sequential(nn.Linear(16, 16, rng=0), nn.ReLU(), nn.Linear(16, 2, rng=1))
>>> with use_policy("fp8-delayed"):
...     _ = model(Tensor(np.ones((2, 16))))
>>> [name for name, _ in named_gemm_slots(model)], sorted(model[0].extra_state()["fp8"])
(['0', '2'], [''])
"""
from __future__ import annotations

from collections.abc import Iterator

from ..autograd import ScalingSlots
from .module import Module

__all__ = ["GemmModule", "named_gemm_slots"]


class GemmModule(Module):
    """A module that runs GEMMs: its FP8/FP4 scaling state, one ``ScalingSlots`` per GEMM
    site, saved in ``extra_state`` (module doc)."""

    _gemm_slots: dict[str, ScalingSlots]     # set past Module.__setattr__: not a submodule

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_gemm_slots", {})

    def gemm_slots(self, site: str = "") -> ScalingSlots:
        """The FP8 scaling state of this module's GEMM ``site`` ("": its only one); kept out
        of the recipe while the module keeps high precision (``keep_high_precision``)."""
        slots = self._gemm_slots.get(site)
        if slots is None:
            slots = self._gemm_slots[site] = ScalingSlots()
        slots.kept = self.__dict__.get("high_precision", False)
        return slots

    def own_gemm_slots(self) -> Iterator[tuple[str, ScalingSlots]]:
        """(site, slots) of each of this module's GEMMs that has run, in the order they ran."""
        return iter(self._gemm_slots.items())

    def extra_state(self) -> dict:
        held = {site: slots.extra_state() for site, slots in self._gemm_slots.items()
                if slots.holds_state()}
        return {"fp8": held} if held else {}

    def set_extra_state(self, state: dict) -> None:
        if not isinstance(state, dict) or set(state) - {"fp8"} or \
                not isinstance(state.get("fp8", {}), dict):
            raise ValueError(f"{type(self).__name__} keeps no extra state but its GEMMs' FP8 "
                             f"scaling ({{'fp8': {{site: state}}}}), got {state!r}")
        restored = {}
        for site, values in state.get("fp8", {}).items():
            restored[site] = ScalingSlots()
            restored[site].set_extra_state(values)      # raises before anything changes
        object.__setattr__(self, "_gemm_slots", restored)


def named_gemm_slots(model: Module) -> Iterator[tuple[str, ScalingSlots]]:
    """(dotted module name[.site], slots) of every GEMM in ``model`` that has run, in module
    order."""
    for name, module in model.named_modules():
        if isinstance(module, GemmModule):
            for site, slots in module.own_gemm_slots():
                yield ".".join(part for part in (name, site) if part), slots
