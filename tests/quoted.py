"""The pages that quote the full run's numbers (figures/summary.json), and the paragraph of
each that a test checks: the README's section on reproducing the paper and the docs site's
page copied from it carry the same paragraphs, so one change of the numbers updates both."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", ROOT / "docs" / "reproduce.md")


def full_run(experiment: str) -> dict:
    """The numbers ``fpsim reproduce`` wrote into figures/summary.json for ``experiment``."""
    summary = json.loads((ROOT / "figures" / "summary.json").read_text())
    return summary["experiments"][experiment]["numbers"]


def paragraphs(opening: str) -> dict:
    """Each page's paragraph that begins with ``opening``, its whitespace collapsed (a quote
    may wrap anywhere), by page name."""
    found = {}
    for page in PAGES:
        text = page.read_text()
        start = text.index(opening)
        end = text.find("\n\n", start)
        paragraph = text[start:] if end < 0 else text[start:end]
        found[f"{page.parent.name}/{page.name}"] = " ".join(paragraph.split())
    return found
