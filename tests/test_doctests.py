"""The examples in docstrings are part of the documentation: every module's must stay true.

The modules are found, not listed: every module of the fpsim package whose source holds an
example (``>>>``) runs them all with doctest. A module whose examples need an optional library
that is not installed (torch, deepspeed, jax, ...) is skipped with the reason; one that needs a
missing *required* dependency, or a missing part of fpsim, fails."""
import doctest
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
import warnings

import pytest

import fpsim

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: 85 modules had examples when discovery replaced the hand-kept list (of 48): far fewer found
#: means the discovery broke, not that the examples went away
FEWEST_MODULES = 80
#: the modules a warning is attributed to that are not fpsim (nor an example, which runs in
#: its module's namespace)
THIRD_PARTY = r"(?!fpsim(\.|$))"


def package_modules():
    """The names of fpsim's modules, and of its packages that failed to import while walked
    (their modules cannot be listed; the test of the package says why).

    ``__main__`` modules are left out: importing one runs the command line."""
    unwalked = []
    names = [info.name for info in pkgutil.walk_packages(fpsim.__path__, "fpsim.",
                                                         onerror=unwalked.append)]
    return [name for name in names if name.rpartition(".")[2] != "__main__"], unwalked


def has_examples(name: str) -> bool:
    """Whether the module's source holds a doctest prompt: read, not imported, so that
    collecting this file imports no optional library (torch alone takes seconds)."""
    with open(importlib.util.find_spec(name).origin, encoding="utf-8") as source:
        return ">>>" in source.read()


def modules_with_examples():
    names, unwalked = package_modules()
    return sorted({name for name in names if has_examples(name)} | set(unwalked))


MODULES_WITH_EXAMPLES = modules_with_examples()


def required_libraries() -> set[str]:
    """The import names of fpsim's required dependencies (the extras' are optional)."""
    required = importlib.metadata.requires("fpsim") or []
    return {re.match(r"[\w.-]+", line).group().lower().replace("-", "_")
            for line in required if "extra ==" not in line}


def missing_optional_library(error: BaseException) -> str | None:
    """The optional library whose absence raised ``error`` (an ImportError, or one raised
    from it, as fpsim's adapters do with the install line), else None."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            top = error.name.partition(".")[0]
            optional = top != "fpsim" and top not in required_libraries()
            return top if optional else None
        error = error.__cause__ or error.__context__
    return None


def skip_if_optional_library_missing(name: str, error: BaseException) -> None:
    library = missing_optional_library(error)
    if library is not None:
        pytest.skip(f"{name}'s examples need {library}, which is not installed: {error}")


class ExampleRunner(doctest.DocTestRunner):
    """A doctest runner that also keeps the exceptions examples raised unexpectedly."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.raised: list[BaseException] = []

    def report_unexpected_exception(self, out, test, example, exc_info) -> None:
        self.raised.append(exc_info[1])
        super().report_unexpected_exception(out, test, example, exc_info)


def imported(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as error:
        skip_if_optional_library_missing(name, error)
        raise


@pytest.mark.numpy_only          # the examples print NumPy values
@pytest.mark.parametrize("name", MODULES_WITH_EXAMPLES)
def test_docstring_examples(name):
    tests = [test for test in doctest.DocTestFinder().find(imported(name)) if test.examples]
    assert tests, f"{name}'s source holds '>>>' but doctest finds no example in its docstrings"
    runner = ExampleRunner(optionflags=OPTIONFLAGS)
    with warnings.catch_warnings():
        # a warning from inside a framework (torch's deprecations that DeepSpeed's imports
        # reach, Megatron's "Apex is not installed") is its own; fpsim's stay errors
        warnings.filterwarnings("ignore", module=THIRD_PARTY)
        for test in tests:
            runner.run(test)
    for error in runner.raised:
        skip_if_optional_library_missing(name, error)
    results = runner.summarize(verbose=False)
    if results.attempted == 0:
        pytest.skip(f"{name}: every example is marked +SKIP (its docstring says why)")
    assert results.failed == 0


def test_the_discovery_finds_the_modules_with_examples():
    assert len(MODULES_WITH_EXAMPLES) >= FEWEST_MODULES, MODULES_WITH_EXAMPLES
    assert {"fpsim.formats", "fpsim.train.runs", "fpsim.nn.traced"} <= set(MODULES_WITH_EXAMPLES)


def test_an_optional_library_is_told_apart_from_a_required_one():
    def raised_from(missing: str) -> ImportError:
        try:
            try:
                importlib.import_module(missing)
            except ImportError as cause:
                raise ImportError(f"this adapter needs {missing}") from cause
        except ImportError as error:
            return error

    assert missing_optional_library(raised_from("no_such_library.sub")) == "no_such_library"
    assert missing_optional_library(raised_from("fpsim.no_such_module")) is None
    assert missing_optional_library(ImportError("cannot import name 'x'")) is None
    assert "numpy" in required_libraries() and "torch" not in required_libraries()
