"""The examples in docstrings are part of the documentation: every module's must stay true."""
import doctest
import importlib

import pytest

MODULES = ["fpsim.formats", "fpsim.files", "fpsim.rounding", "fpsim.encoding", "fpsim.describe",
           "fpsim.train.trace", "fpsim.train.checkpoint", "fpsim.optim.arith",
           "fpsim.optim.rules", "fpsim.optim.optimizer", "fpsim.optim.transforms",
           "fpsim.optim.flat", "fpsim.optim.updates", "fpsim.optim.schedules",
           "fpsim.exact", "fpsim.exact.underflow",
           "fpsim.exact.accumulation", "fpsim.exact.promoted", "fpsim.exact.sums",
           "fpsim.exact.odd_rounding",
           "fpsim.exact.certificate",
           "fpsim.backend", "fpsim.autograd", "fpsim.autograd.numerics",
           "fpsim.autograd.policy", "fpsim.autograd.context", "fpsim.autograd.tensor",
           "fpsim.autograd.accumulate",
           "fpsim.autograd.ops_shape", "fpsim.autograd.ops_matmul",
           "fpsim.autograd.ops_elementwise", "fpsim.autograd.ops_reduce",
           "fpsim.autograd.ops_loss", "fpsim.nn", "fpsim.nn.module", "fpsim.nn.init",
           "fpsim.nn.layers", "fpsim.nn.lstm", "fpsim.nn.attention",
           "fpsim.conformance", "fpsim.conformance.trace",
           "fpsim.conformance.replay", "fpsim.conformance.adapters",
           "fpsim.conformance.patterns", "fpsim.conformance.cast_check",
           "fpsim.conformance.expect", "fpsim.conformance.mx_check", "fpsim.quant.nvfp4"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
