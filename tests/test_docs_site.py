"""The documentation site (mkdocs.yml, docs/): every Python example of its pages runs, page by
page, as the README's do (tests/test_readme.py), and the site builds with `mkdocs build
--strict` (no broken link, no missing reference) where the `docs` extra is installed (about
7 s on 2 idle cores, the API reference and the ten lessons included, so it is not marked slow;
CI's .ci/run also builds the site strictly before the tests)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from doc_examples import python_blocks, runnable_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")
               if "_hooks" not in path.parts)
WITH_EXAMPLES = [page for page in PAGES if python_blocks((DOCS / page).read_text())]
# the packages of the docs extra, as imported
SITE_BUILDERS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python",
                 "mkdocs_jupyter")


def nav_pages(entries):
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from nav_pages(value)
        else:
            yield value


def nav():
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it
    return list(nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    entries = nav()
    assert sorted(p for p in entries if p.endswith(".md")) == PAGES
    for entry in entries:           # pages in docs/; the lessons from notebooks/
        assert (DOCS / entry).exists() or (ROOT / entry).exists(), entry
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(Path(p).name for p in entries if p.endswith(".ipynb")) == lessons


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_reach_a_file_as_github_reads_them(page):
    """What mkdocs --strict checks on the site, checked on the Markdown as GitHub shows it:
    every relative link of a page names a file of the repository."""
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if "://" in target:
            continue
        assert (DOCS / page).parent.joinpath(target).resolve().exists(), (page, target)


def test_the_api_reference_covers_every_package():
    documented = set(re.findall(r"^::: (fpsim[\w.]*)", "\n".join(
        (DOCS / "api" / name).read_text() for name in os.listdir(DOCS / "api")), re.M))
    packages = {f"fpsim.{path.parent.name}" for path in (ROOT / "fpsim").glob("*/__init__.py")}
    assert packages <= documented, sorted(packages - documented)


@pytest.mark.parametrize("page", WITH_EXAMPLES)
def test_the_pages_python_examples_run(page, tmp_path):
    blocks, missing = runnable_blocks((DOCS / page).read_text())
    if not blocks:
        pytest.skip(f"{page}: its examples need {', '.join(missing)}, not installed")
    script = tmp_path / "page_examples.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow      # 7-28 s; CI builds the site strictly as a step of its own (.ci/run)
def test_the_site_builds_strictly(tmp_path):
    missing = [name for name in SITE_BUILDERS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed (missing {', '.join(missing)}): "
                    f'pip install -e ".[docs]"')
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "train" / "index.html").exists()
    assert (tmp_path / "site" / "notebooks" / "01_number_formats" / "index.html").exists()


def load_hook(name, needs):
    pytest.importorskip(needs, reason=f"the docs extra is not installed ({needs})")
    spec = importlib.util.spec_from_file_location(name, DOCS / "_hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doctest_lines_are_fenced_for_the_api_reference():
    fence = load_hook("griffe_doctests", "griffe").fence_doctests
    text = "The scale.\n\n>>> [1.0, 8.0][:1]\n[1.0]\n\nThen.\n    >>> x = 1\n    >>> x\n    1"
    assert fence(text) == ("The scale.\n\n```pycon\n>>> [1.0, 8.0][:1]\n[1.0]\n```\n\nThen.\n"
                           "    ```pycon\n    >>> x = 1\n    >>> x\n    1\n    ```")
    assert fence("No example here.\n\nNone.") == "No example here.\n\nNone."


def test_links_to_figures_and_lessons_reach_them_in_the_site():
    site_link = load_hook("site", "mkdocs").site_link
    assert site_link("../figures/fp8.png", "") == "figures/fp8.png"
    assert site_link("../../notebooks/01_number_formats.ipynb", "frameworks") == \
        "../notebooks/01_number_formats.ipynb"
    for unchanged in ("engine.md", "../conformance.md", "https://www.mkdocs.org/"):
        assert site_link(unchanged, "frameworks" if unchanged.startswith("..") else "") == \
            unchanged
