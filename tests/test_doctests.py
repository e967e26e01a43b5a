"""The examples in docstrings are part of the documentation: they must stay true."""
import doctest
import importlib

import pytest

MODULES = ["fpsim.formats", "fpsim.rounding", "fpsim.encoding", "fpsim.describe",
           "fpsim.train.trace", "fpsim.train.checkpoint", "fpsim.optim.arith",
           "fpsim.optim.rules", "fpsim.optim.optimizer", "fpsim.autograd.underflow"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
