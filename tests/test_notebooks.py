"""The lessons in notebooks/ are saved executed and use only the public API.

nbval (pyproject's addopts) re-runs each lesson and compares its text outputs; this file checks
what nbval does not: that the saved file was executed top to bottom in one go (execution counts
1, 2, 3, ... on every code cell, so no cell was skipped or run twice), that no saved output is
an error, and that every fpsim name a lesson imports is public (in its module's ``__all__``, or
a public submodule), never an underscore name.
"""
import ast
import importlib
import importlib.util
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def python_source(cell) -> str:
    """The cell without IPython magics and shell escapes, which are not Python."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in cell.source.splitlines())


def fpsim_imports(tree):
    """(module, name) for every ``from fpsim... import name`` and (module, None) for ``import``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fpsim":
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fpsim":
                    yield alias.name, None


def test_there_are_lessons():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_executed_in_order(path):
    cells = code_cells(path)
    assert cells, f"{path.name} has no code"
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts}; run notebooks/refresh.py to save it executed")
    assert any(c.outputs for c in cells), f"{path.name} was saved without outputs"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} has a saved error: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_only_public_api(path):
    for cell in code_cells(path):
        tree = ast.parse(python_source(cell))
        for module, name in fpsim_imports(tree):
            assert not any(part.startswith("_") for part in module.split(".")), (path.name, module)
            mod = importlib.import_module(module)
            if name is None or name == "*":
                continue
            public = getattr(mod, "__all__", ())
            is_submodule = importlib.util.find_spec(f"{module}.{name}") is not None \
                if hasattr(mod, "__path__") else False
            assert name in public or (is_submodule and not name.startswith("_")), (
                f"{path.name} imports {name!r} from {module}, which does not export it")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                pytest.fail(f"{path.name} reaches a private name: .{node.attr}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_solutions_are_folded_under_a_heading(path):
    """Each solution (a code cell opening with '# N.') sits folded under 'Solution to exercise
    N', after a '## Solutions' section, so that the exercises can be tried first."""
    cells = nbformat.read(path, as_version=4).cells
    solutions = [i for i, c in enumerate(cells)
                 if c.cell_type == "code" and c.source[:2] == "# " and c.source[2:4].rstrip()
                 and c.source[2].isdigit() and c.source[3] == "."]
    assert len(solutions) >= 2
    first_heading = next(i for i, c in enumerate(cells) if "## Solutions" in c.source)
    for i in solutions:
        assert i > first_heading
        assert cells[i].metadata.get("jupyter", {}).get("source_hidden") is True, i
        assert cells[i - 1].source == f"### Solution to exercise {cells[i].source[2]}"


def test_lesson_5_takes_its_recipes_from_recipe_for():
    source = "\n".join(c.source for c in code_cells(NOTEBOOKS[4]))
    assert "recipe_for(get_policy(recipe))" in source
    assert '"32-true": ("fp32"' not in source         # no hand-written table to drift
