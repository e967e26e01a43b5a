"""The lessons in notebooks/ are saved executed and use only the public API.

nbval (pyproject's addopts) re-runs each lesson and compares its text outputs; this file checks
what nbval does not: that the saved file was executed top to bottom in one go (execution counts
1, 2, 3, ... on every code cell, so no cell was skipped or run twice), that no saved output is
an error, and that every fpsim name a lesson imports is public (in its module's ``__all__``, or
a public submodule), never an underscore name. It also checks the exercise versions in
notebooks/exercises/: what notebooks/exercises.py makes from the lessons, byte for byte, without
solutions, and never collected by nbval.
"""
import ast
import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = ROOT / "notebooks" / "exercises"


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
    # the exercise version (notebooks/exercises.py) removes exactly the cells tagged 'solution'
    tagged = [i for i, c in enumerate(cells) if "solution" in c.metadata.get("tags", ())]
    assert tagged == solutions, f"{path.name}: tag each solution cell, and only those, 'solution'"


def test_lesson_5_takes_its_recipes_from_recipe_for():
    source = "\n".join(c.source for c in code_cells(NOTEBOOKS[4]))
    assert "recipe_for(get_policy(recipe))" in source
    assert '"32-true": ("fp32"' not in source         # no hand-written table to drift


def exercises_script():
    """notebooks/exercises.py, the generator of the exercise versions (a script, not in fpsim)."""
    spec = importlib.util.spec_from_file_location("lesson_exercises",
                                                  ROOT / "notebooks" / "exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exercise_versions_are_what_the_generator_makes():
    """notebooks/exercises/NN_*.ipynb, one per lesson, each byte for byte what exercises.py makes
    from its solved lesson: a lesson changed without regenerating them fails here."""
    script = exercises_script()
    assert sorted(p.name for p in EXERCISES.glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
    assert script.stale(NOTEBOOKS) == [], "run python notebooks/exercises.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_version_has_no_solution(path):
    solved = code_cells(path)
    exercise = code_cells(EXERCISES / path.name)
    stubs = [c.source for c in exercise if "raise NotImplementedError" in c.source]
    assert stubs == [f'# YOUR CODE HERE (exercise {n})\nraise NotImplementedError("exercise {n}")'
                     for n in range(1, len(stubs) + 1)] and len(stubs) >= 2
    hidden = {c.source for c in solved if "solution" in c.metadata.get("tags", ())}
    assert not hidden & {c.source for c in exercise}
    assert all(c.outputs == [] and c.execution_count is None for c in exercise)
    assert len(exercise) == len(solved)          # every other cell kept, in order


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_version_paths_resolve_from_its_folder(path):
    """The exercise notebooks run from notebooks/exercises/: every relative path they open
    must exist from there (exercises.py adds a '../' to the lessons' paths)."""
    for cell in code_cells(EXERCISES / path.name):
        for relative in re.findall(r"""["'](\.\./[^"']+)["']""", cell.source):
            assert (EXERCISES / relative).exists(), (path.name, relative)


def test_generator_refuses_a_lesson_without_the_convention(tmp_path):
    script = exercises_script()
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("tags", None)               # solutions left unmarked
    lesson = tmp_path / NOTEBOOKS[0].name
    nbformat.write(nb, lesson)
    with pytest.raises(ValueError, match=r"^01_number_formats.ipynb: the cells tagged 'solution' "
                                         r"answer exercises \[\], the '## Exercises' list has "
                                         r"\[1, 2, 3\]$"):
        script.without_solutions(lesson)


def test_nbval_does_not_run_the_exercise_versions():
    """They raise NotImplementedError by design: notebooks/conftest.py keeps pytest from
    collecting notebooks/exercises/, while every lesson is still collected."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "notebooks"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert collected == {f"notebooks/{p.name}" for p in NOTEBOOKS}, collected


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_version_runs_to_its_first_exercise(path, monkeypatch):
    """Run top to bottom from its own folder, an exercise notebook stops at the first
    exercise's NotImplementedError, and nowhere before it."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # the kernel is a subprocess: it imports this checkout's fpsim, as notebooks/conftest.py has it
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(EXERCISES / path.name, as_version=4)
    first_stub = next(i for i, c in enumerate(nb.cells) if "raise NotImplementedError" in c.source)
    client = NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(EXERCISES)}})
    with pytest.raises(CellExecutionError, match="NotImplementedError"):
        client.execute()
    ran = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.outputs]
    assert ran and max(ran) == first_stub


def requirement_name(requirement: str) -> str:
    """'torch==2.13.0' -> 'torch' (names compared as pip does: lower case, '-' for '_')."""
    return re.split(r"[\s<>=!~\[;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def installs_with(names) -> set:
    """The requirements of these distributions, where installed here (IPython comes with
    ipykernel), each without its own extras."""
    found = set()
    for name in names:
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        found |= {requirement_name(r) for r in requires if "extra ==" not in r}
    return found


def test_the_notebooks_extra_installs_what_every_lesson_imports():
    """pip install -e ".[notebooks]" is enough for every lesson, lesson 7's PyTorch included:
    each module a lesson imports comes with Python, with fpsim, or with a distribution that
    fpsim's dependencies or that extra install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(extras["torch"]) <= set(extras["notebooks"])          # torch pinned the same
    declared = {requirement_name(r) for r in project["dependencies"] + extras["notebooks"]}
    brought = declared | installs_with(declared)
    providers = importlib.metadata.packages_distributions()
    for path in NOTEBOOKS:
        for cell in code_cells(path):
            for node in ast.walk(ast.parse(python_source(cell))):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                           else [])
                tops = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names)
                for top in tops - {"fpsim"}:
                    dists = {requirement_name(d) for d in providers.get(top, [])}
                    assert dists & brought, \
                        f"{path.name} imports {top}, which the notebooks extra does not install"
