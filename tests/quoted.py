"""The pages that quote the full run's numbers (figures/summary.json), and the paragraph of
each that a test checks: docs/reproduce.md holds every experiment's paragraph; the README, the
front door, quotes those it shows (the picture's caption), the same words as the page's."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOLDER = ROOT / "docs" / "reproduce.md"
PAGES = (ROOT / "README.md", HOLDER)


def full_run(experiment: str) -> dict:
    """The numbers ``fpsim reproduce`` wrote into figures/summary.json for ``experiment``."""
    summary = json.loads((ROOT / "figures" / "summary.json").read_text())
    return summary["experiments"][experiment]["numbers"]


def paragraphs(opening: str) -> dict:
    """Each page's paragraph that begins with ``opening``, its whitespace collapsed (a quote
    may wrap anywhere), by page name: HOLDER's always, the README's where it quotes it."""
    found = {}
    for page in PAGES:
        text = page.read_text()
        if page != HOLDER and opening not in text:
            continue
        start = text.index(opening)
        end = text.find("\n\n", start)
        paragraph = text[start:] if end < 0 else text[start:end]
        found[f"{page.parent.name}/{page.name}"] = " ".join(paragraph.split())
    return found
