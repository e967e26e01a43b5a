"""The docstring examples of fpsim.conformance must stay true."""
import doctest
import importlib

import pytest

MODULES = ["fpsim.conformance", "fpsim.conformance.trace", "fpsim.conformance.replay",
           "fpsim.conformance.adapters", "fpsim.conformance.patterns",
           "fpsim.conformance.cast_check"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
