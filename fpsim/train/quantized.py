"""What a run under an FP8/FP4 recipe sets up on its model: the layers a recipe's ``keep=``
holds in bf16, and the keys of the GEMMs' stochastic rounding.

``keep=NAME1+NAME2`` (any recipe string, ``fpsim.quant.recipe``) names modules as
``model.named_modules()`` does ("2", "blocks.3.mlp"); ``KeptLayers`` checks every name before
the run (an unknown one is refused by name, with the closest names the model has) and, while
entered, keeps those modules' GEMMs out of the recipe (``Module.keep_high_precision``), as
``nn.Linear(..., fp8=False)`` keeps one in code. The NVFP4 paper keeps its last layers so.

Stochastic rounding (``nvfp4``) draws Philox counters under a key per GEMM:
``seed_stochastic_rounding`` sets each GEMM's key from the run's seed and the GEMM's name (the
first 8 bytes of SHA-256 of ``"fpsim-sr:<seed>:<name>"``), so GEMMs draw independently, two
runs with one seed draw alike, and the counters (saved in checkpoints with the key) continue
on resume.
"""
from __future__ import annotations

import difflib
import hashlib

from ..nn.gemm import named_gemm_slots

__all__ = ["KeptLayers", "seed_stochastic_rounding", "gemm_key"]


class KeptLayers:
    """The modules ``recipe.keep`` names in ``model``, checked now; ``with`` it, their GEMMs
    stay out of the recipe (the flags they had come back on exit)."""

    def __init__(self, model, recipe) -> None:
        names = tuple(recipe.keep) if recipe is not None else ()
        modules = dict(model.named_modules())
        for name in names:
            if name not in modules:
                raise ValueError(_unknown(name, recipe.name, modules))
        self.modules = {name: modules[name] for name in names}
        self._saved: dict = {}

    def __enter__(self) -> "KeptLayers":
        for module in self.modules.values():
            for _, inner in module.named_modules():
                self._saved.setdefault(id(inner), (inner, getattr(inner, "high_precision",
                                                                  False)))
            module.keep_high_precision(True)
        return self

    def __exit__(self, *exc) -> None:
        for inner, flag in self._saved.values():
            inner.high_precision = flag
        self._saved = {}

    def check_they_run_gemms(self) -> None:
        """After a forward pass (the dry run): each kept module ran a GEMM, else its name
        was a mistake that would keep nothing."""
        for name, module in self.modules.items():
            if not any(True for _ in named_gemm_slots(module)):
                raise ValueError(f"recipe keep={name!r}: module {name!r} "
                                 f"({type(module).__name__}) runs no GEMM, so keeping it in "
                                 f"bf16 changes nothing; name a Linear layer or a module "
                                 f"holding one")


def _unknown(name: str, recipe_name: str, modules: dict) -> str:
    with_gemms = [n for n, m in modules.items() if n and type(m).__name__ == "Linear"]
    close = difflib.get_close_matches(name, [n for n in modules if n], 1, 0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(with_gemms[:12]) + (", ..." if len(with_gemms) > 12 else "")
    return (f"recipe {recipe_name!r}: keep names {name!r}, which is not a module of this "
            f"model{hint}; its Linear layers are {listed or 'none'} (names as "
            f"model.named_modules() gives them)")


def gemm_key(seed: int, name: str) -> int:
    """The Philox key of GEMM ``name``'s stochastic rounding in a run with ``seed``."""
    digest = hashlib.sha256(f"fpsim-sr:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def seed_stochastic_rounding(model, seed: int) -> None:
    """Key every GEMM the model has run by ``seed`` and its name (module doc)."""
    for name, slots in named_gemm_slots(model):
        slots.sr_seed = gemm_key(seed, name)
