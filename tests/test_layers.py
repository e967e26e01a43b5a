"""The architecture, read from the source with ``ast``: layer order, no private names across
modules, no import cycles.

Layers, lowest first (``fpsim/__init__.py`` docstring); a module may import from its own layer
or lower ones only. ``fpsim/__init__.py`` itself is exempt (it re-exports every layer).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fpsim"

LAYERS = [
    ["formats", "_version", "files", "options", "grammar"],
    ["rounding"],
    ["encoding", "describe"],
    ["backend"],
    ["exact"],
    ["quant"],
    ["autograd"],
    ["nn", "optim", "scaling"],
    ["train"],
    ["experiments", "plots", "conformance", "sweep", "cli", "__main__"],
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def read_modules(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    """Dotted module name -> (path, parsed source) for every .py file under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = (path, ast.parse(path.read_text(), str(path)))
    return modules


def _is_package(name: str, modules: dict) -> bool:
    return modules[name][0].name == "__init__.py"


def imports(name: str, tree: ast.Module, modules: dict) -> list[tuple[int, str, str | None]]:
    """(line, imported fpsim module, imported name or None) for every import in the module,
    function-level ones included. ``from pkg import sub`` of a submodule names the submodule."""
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "fpsim"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "fpsim":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    found.append((node.lineno, sub, None))
                else:
                    found.append((node.lineno, target, alias.name))
    return found


def _top(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_violations(modules: dict) -> list[str]:
    out = []
    for name, (path, tree) in modules.items():
        if name == "fpsim":
            continue
        for line, target, _ in imports(name, tree, modules):
            top = _top(target)
            if top is None or _top(name) == top:
                continue
            if RANK[top] > RANK[_top(name)]:
                out.append(f"{path.name}:{line}: {name} ({_top(name)}, layer {RANK[_top(name)]}) "
                           f"imports {target} ({top}, layer {RANK[top]}), a higher layer")
    return out


def private_violations(modules: dict) -> list[str]:
    """Private names imported from another module, private modules imported from outside
    their package, and private attributes read off an imported fpsim module."""
    out = []
    for name, (path, tree) in modules.items():
        bound = {}                                   # local name -> imported fpsim module
        for line, target, imported in imports(name, tree, modules):
            parts = target.split(".")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if _is_private(part) and not (name == owner or name.startswith(owner + ".")):
                    out.append(f"{path.name}:{line}: {name} imports {target}, private to "
                               f"{owner}")
            if imported is not None and _is_private(imported) and target != name:
                out.append(f"{path.name}:{line}: {name} imports the private name "
                           f"{imported} from {target}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    for _, target, imported in imports(name, ast.Module([node], []), modules):
                        if imported is None and target.endswith("." + alias.name):
                            bound[local] = target
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and _is_private(node.attr)):
                out.append(f"{path.name}:{node.lineno}: {name} reads "
                           f"{bound[node.value.id]}.{node.attr}, a private name")
    return out


def import_cycles(modules: dict) -> list[list[str]]:
    """Cycles in the module import graph, a package's ``__init__`` importing its own
    submodules left out (that is how a package assembles its namespace)."""
    graph = {}
    for name, (_, tree) in modules.items():
        graph[name] = {target for _, target, _ in imports(name, tree, modules)
                       if target in modules and target != name
                       and not (_is_package(name, modules) and target.startswith(name + "."))}
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


@pytest.fixture(scope="module")
def modules():
    return read_modules(PACKAGE)


def test_every_top_level_module_has_a_layer(modules):
    tops = {_top(name) for name in modules} - {None}
    missing = sorted(tops - RANK.keys())
    assert not missing, f"give these modules a layer in LAYERS (tests/test_layers.py): {missing}"


def test_no_module_imports_a_higher_layer(modules):
    violations = layer_violations(modules)
    assert not violations, "\n".join(violations)


def test_no_private_names_cross_modules(modules):
    violations = private_violations(modules)
    assert not violations, "\n".join(violations)


def test_no_import_cycles(modules):
    cycles = import_cycles(modules)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


# --- the checks catch what they should: a planted package ---------------------------------

PLANTED = {
    "__init__.py": "from . import autograd\n",
    "exact/__init__.py": "from . import sums\nfrom .sums import total\n",
    "exact/sums.py": "from ..autograd.tensor import Tensor\n",       # a higher layer
    "autograd/__init__.py": "",
    "autograd/tensor.py": "from ..exact import sums\nfrom ..exact.sums import _limbs\n"
                          "x = sums._chunk\n",                         # private names
    "autograd/ops.py": "from .tensor import Tensor\nfrom . import _helpers\n",
    "autograd/_helpers.py": "from .ops import Tensor\n",              # a cycle
    "nn/__init__.py": "from ..autograd._helpers import y\n",          # private module
}


def test_the_checks_catch_a_planted_package(tmp_path):
    for rel, text in PLANTED.items():
        path = tmp_path / "fpsim" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    planted = read_modules(tmp_path / "fpsim")
    assert [v.split(": ", 1)[1] for v in layer_violations(planted)] == [
        "fpsim.exact.sums (exact, layer 4) imports fpsim.autograd.tensor (autograd, layer 6), "
        "a higher layer"]
    assert sorted(v.split(": ", 1)[1] for v in private_violations(planted)) == [
        "fpsim.autograd.tensor imports the private name _limbs from fpsim.exact.sums",
        "fpsim.autograd.tensor reads fpsim.exact.sums._chunk, a private name",
        "fpsim.nn imports fpsim.autograd._helpers, private to fpsim.autograd"]
    assert sorted(import_cycles(planted)) == [
        ["fpsim.autograd._helpers", "fpsim.autograd.ops", "fpsim.autograd._helpers"],
        ["fpsim.autograd.tensor", "fpsim.exact.sums", "fpsim.autograd.tensor"]]
