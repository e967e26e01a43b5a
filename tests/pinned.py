"""Pinned results that say where a run parts from them.

A test pins a result by its SHA-256 (``json.dumps(numbers, sort_keys=True)``); beside it,
``tests/data/pinned/<name>.json`` holds the pinned numbers themselves, checked against the same
digest, so that a result which no longer matches is reported as the first place it differs
(``runs['torch GradScaler']['losses'][17]: 0.6931 != 0.6930``): the step and the field, as
``fpsim compare`` reports two runs.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

PINNED_DIR = Path(__file__).resolve().parent / "data" / "pinned"


def digest(numbers) -> str:
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()


def first_difference(expected, found, path: str = "") -> str | None:
    """The first path (keys and list indices, in sorted-key order) where ``found`` differs
    from ``expected``, with both values; None when they are equal."""
    if isinstance(expected, dict) and isinstance(found, dict):
        for key in sorted(set(expected) | set(found)):
            if key not in found:
                return f"{path}[{key!r}]: missing (pinned: {_short(expected[key])})"
            if key not in expected:
                return f"{path}[{key!r}]: not in the pinned result ({_short(found[key])})"
            where = first_difference(expected[key], found[key], f"{path}[{key!r}]")
            if where:
                return where
        return None
    if isinstance(expected, list) and isinstance(found, list):
        for i, (a, b) in enumerate(zip(expected, found)):
            where = first_difference(a, b, f"{path}[{i}]")
            if where:
                return where
        if len(expected) != len(found):
            return f"{path}: {len(found)} entries, pinned {len(expected)}"
        return None
    same = json.dumps(expected) == json.dumps(found)
    return None if same else f"{path or 'result'}: {_short(found)} != pinned {_short(expected)}"


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def assert_pinned(name: str, numbers, pinned_digest: str) -> None:
    """``numbers`` hash to ``pinned_digest``; if not, the failure names where they part."""
    stored = json.loads((PINNED_DIR / f"{name}.json").read_text())
    assert digest(stored) == pinned_digest, f"{PINNED_DIR / name}.json is not the pinned result"
    found = json.loads(json.dumps(numbers))        # as JSON holds it (tuples become lists)
    if digest(numbers) != pinned_digest:
        raise AssertionError(f"{name} parts from the pinned run at "
                             f"{first_difference(stored, found)}")
