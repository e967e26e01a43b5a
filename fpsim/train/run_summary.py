"""Two runs side by side, as ``fpsim compare`` shows them beside their first differing bit:
final and best loss, the loss gap over the steps both ran, skipped steps, and where a run
diverged (its first NaN or infinite loss). Comparing recipes (16-mixed against bf16-mixed,
a scaler against none) differs at step 0; this says by how much, and how it ends.

>>> a = {"loss": (1.0, 0.5, 0.25), "skipped": (False, False, False)}
>>> b = {"loss": (1.0, 0.75, float("nan")), "skipped": (False, True, False)}
>>> print("\\n".join(side_by_side((0, 1, 2), a, (0, 1, 2), b)))
side by side (A | B):
  final loss     0.25 | nan
  best loss      0.25 at step 2 | 0.75 at step 1
  skipped steps  0 | 1
  diverged       no | at step 2
  loss B - A     mean 0.125, largest 0.25 at step 1 (over 2 steps where both are finite)
"""
from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["RunOutcome", "outcome", "side_by_side"]


class RunOutcome(NamedTuple):
    """How a run ended: its last loss, its least finite loss and that step (None without
    one), its skipped steps, and the step of its first non-finite loss (None: never)."""

    final_loss: float
    best_loss: float | None
    best_step: int | None
    skipped: int
    diverged_at: int | None


def outcome(steps, columns: dict) -> RunOutcome:
    """The ``RunOutcome`` of a run's ``loss`` and ``skipped`` columns."""
    losses = columns["loss"]
    finite = [(loss, step) for step, loss in zip(steps, losses) if math.isfinite(loss)]
    best_loss, best_step = min(finite) if finite else (None, None)
    diverged = next((step for step, loss in zip(steps, losses) if not math.isfinite(loss)), None)
    return RunOutcome(losses[-1], best_loss, best_step, sum(columns.get("skipped", ())),
                      diverged)


def side_by_side(steps_a, columns_a: dict, steps_b, columns_b: dict) -> list[str]:
    """The lines ``fpsim compare`` prints for two training runs (see the module doc)."""
    a, b = outcome(steps_a, columns_a), outcome(steps_b, columns_b)
    rows = [("final loss", f"{a.final_loss:.6g}", f"{b.final_loss:.6g}"),
            ("best loss", _best(a), _best(b)),
            ("skipped steps", str(a.skipped), str(b.skipped)),
            ("diverged", _diverged(a), _diverged(b))]
    lines = ["side by side (A | B):"]
    lines += [f"  {name:<13}  {left} | {right}" for name, left, right in rows]
    lines.append(f"  loss B - A     {_gap(steps_a, columns_a['loss'], steps_b, columns_b['loss'])}")
    return lines


def _best(result: RunOutcome) -> str:
    if result.best_loss is None:
        return "none finite"
    return f"{result.best_loss:.6g} at step {result.best_step}"


def _diverged(result: RunOutcome) -> str:
    return "no" if result.diverged_at is None else f"at step {result.diverged_at}"


def _gap(steps_a, losses_a, steps_b, losses_b) -> str:
    """The mean and the largest (in magnitude) of B's loss less A's over the common steps
    where both are finite."""
    by_step = dict(zip(steps_b, losses_b))
    gaps = [(by_step[step] - loss, step) for step, loss in zip(steps_a, losses_a)
            if step in by_step and math.isfinite(loss) and math.isfinite(by_step[step])]
    if not gaps:
        return "no step where both losses are finite"
    mean = sum(gap for gap, _ in gaps) / len(gaps)
    largest, at = max(gaps, key=lambda item: (abs(item[0]), -item[1]))
    return (f"mean {mean:.6g}, largest {largest:.6g} at step {at} (over {len(gaps)} steps "
            f"where both are finite)")
