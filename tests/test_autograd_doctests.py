"""The examples in the engine's and the layers' docstrings must stay true."""
import doctest
import importlib

import pytest

MODULES = ["fpsim.backend", "fpsim.autograd", "fpsim.autograd.numerics",
           "fpsim.autograd.policy", "fpsim.autograd.context", "fpsim.autograd.tensor",
           "fpsim.autograd.ops_shape", "fpsim.autograd.ops_matmul",
           "fpsim.autograd.ops_elementwise", "fpsim.autograd.ops_reduce",
           "fpsim.autograd.ops_loss", "fpsim.nn", "fpsim.nn.module", "fpsim.nn.init",
           "fpsim.nn.layers", "fpsim.nn.lstm"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
