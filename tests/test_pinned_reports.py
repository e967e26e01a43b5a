"""The pinned-result helper names where a run parts from its pin (tests/pinned.py)."""
import json

import pytest

from pinned import PINNED_DIR, assert_pinned, digest, first_difference


def test_first_difference_names_the_step_and_field():
    pinned = json.loads((PINNED_DIR / "train_loss_series.json").read_text())["steps"]
    changed = json.loads(json.dumps(pinned))
    changed[17]["loss"] = 0.5
    where = first_difference(pinned, changed)
    assert where.startswith("[17]['loss']: 0.5 != pinned ")
    assert first_difference(pinned, pinned[:-1]) == ": 39 entries, pinned 40"
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == "['b']: not in the pinned result (2)"
    assert first_difference(pinned, json.loads(json.dumps(pinned))) is None


def test_assert_pinned_reports_where(tmp_path):
    numbers = json.loads((PINNED_DIR / "overflow.json").read_text())
    assert_pinned("overflow", numbers, digest(numbers))
    run = next(iter(numbers["runs"]))
    numbers["runs"][run]["skipped_steps"] += 1
    with pytest.raises(AssertionError, match=rf"parts from the pinned run at \['runs'\]\['{run}'\]"
                                             rf"\['skipped_steps'\]"):
        assert_pinned("overflow", numbers, digest(json.loads(
            (PINNED_DIR / "overflow.json").read_text())))
