"""Judging a cell against its baseline: the same run in full precision, where the sweep has it.

Fixed thresholds put two seeds that end a hair apart (trailing losses 1.2402 and 1.2500 with
4 classes, either side of 0.9 ln 4 = 1.2477) on two sides, though both did what fp32 does on
that problem. A sweep that holds the fp32 run of a cell's problem judges the cell against it:

- **Precision fields** (``PRECISION_FIELDS``): ``policy``, ``master`` and ``scaler``, which
  change how the numbers are stored and rounded. Every other field of ``fpsim train`` (data,
  model, optimizer, learning rate, steps, seed, ...) says which problem a cell trains.
- **Full-precision cells**: policy ``32-true`` (or a spelling fpsim reads as it: ``32``) with
  the master unset, ``none`` or fp32 (in fp32 all three keep the weights in fp32). Any
  scaler: loss scaling is a remedy for the narrow formats, not a format.
- **The baseline** of any other cell: the full-precision cell of the same problem (every
  other field equal, the seed included) that shares the most of the cell's scaler and master
  values (an fp32 run with the cell's own loss scale, where the sweep crosses ``scaler`` with
  ``policy``), the first in cell order on a tie (a sweep that pairs each policy with its own
  scaler in ``[zip]``). Full-precision cells are the references: the fixed thresholds judge
  them.
- **The rule**: a cell with baseline trailing loss ``B`` (``B`` below the plateau ``L``:
  the baseline converged) and trailing loss ``T`` is ``converged`` when it ends at least as
  close to its baseline as to the plateau, ``T - B <= L - T`` (it kept at least half the
  progress fp32 made), else ``stalled``; ``diverged`` is the fixed rule's (a NaN or inf loss,
  or ``T`` above 1.5 L) and ``failed`` stays failed.
- **Where the fixed thresholds stay**: no baseline in the sweep; the baseline not finished
  yet (``results.csv`` is rewritten as cells finish: the last table judges against every
  baseline); the baseline failed, diverged or stalled (fp32 that never left the plateau
  cannot say whether the format held a run back).
"""
from __future__ import annotations

from .. import formats
from ..autograd import get_policy
from .results import plateau_loss

__all__ = ["PRECISION_FIELDS", "is_full_precision", "find_baselines", "judge"]

PRECISION_FIELDS = ("policy", "master", "scaler")
FULL_PRECISION_POLICY = "32-true"


def is_full_precision(config: dict) -> bool:
    """Whether a cell's configuration is an fp32 run (its policy 32-true, its weights kept
    in fp32): a baseline for the cells of its problem."""
    if get_policy(config["policy"]).name != FULL_PRECISION_POLICY:
        return False
    master = config["master"]
    return master is None or master.lower() == "none" or formats.get(master).name == "fp32"


def find_baselines(configs: dict[int, dict]) -> dict[int, int]:
    """Each cell's baseline cell (cell index -> baseline's index) among ``configs`` (cell
    index -> its full training configuration); cells without one, and the full-precision
    cells themselves, are left out."""
    references: dict[tuple, list[int]] = {}
    for index in sorted(configs):
        if is_full_precision(configs[index]):
            references.setdefault(_problem(configs[index]), []).append(index)
    baselines = {}
    for index, config in configs.items():
        candidates = references.get(_problem(config), [])
        if candidates and not is_full_precision(config):
            # most precision settings in common first; max keeps the first of equals
            baselines[index] = max(candidates, key=lambda other: sum(
                configs[other][name] == config[name] for name in PRECISION_FIELDS))
    return baselines


def _problem(config: dict) -> tuple:
    """What a cell trains, whatever the precision: every other field and its value."""
    # list values (--model-arg K=V ...) as tuples: the key must hash
    return tuple(sorted((name, tuple(value) if isinstance(value, list) else value)
                        for name, value in config.items() if name not in PRECISION_FIELDS))


def judge(rows: list[dict], baselines: dict[int, int]) -> list[dict]:
    """The table's rows: each cell's own row (``summarize``'s, judged by fixed thresholds)
    with its outcome judged against its baseline where ``rows`` hold one that converged,
    and the judgement columns (``results.JUDGEMENT``) filled in."""
    by_cell = {row["cell"]: row for row in rows}
    return [_judged(row, baselines.get(row["cell"]), by_cell.get(baselines.get(row["cell"])))
            for row in rows]


def _judged(row: dict, baseline_cell: "int | None", baseline: "dict | None") -> dict:
    judged = dict(row, judged_by=None, baseline_cell=baseline_cell, baseline_trailing_loss=None)
    if row["status"] != "ok":
        return judged
    judged["judged_by"] = "absolute"
    if baseline is None or baseline["status"] != "ok":
        return judged
    judged["baseline_trailing_loss"] = baseline["trailing_loss"]
    if baseline["outcome"] != "converged":
        return judged
    judged["judged_by"] = "baseline"
    if row["outcome"] != "diverged":      # diverged: the fixed rule's NaN or 1.5 L holds
        trailing, reference = row["trailing_loss"], baseline["trailing_loss"]
        plateau = plateau_loss(row["classes"])     # the baseline's too: the same problem
        judged["outcome"] = ("converged" if trailing - reference <= plateau - trailing
                             else "stalled")
    return judged

