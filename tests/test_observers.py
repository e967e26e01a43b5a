"""The observer registry (``fpsim.exact.observers``): the one place that knows who watches the
engine's roundings and products; per thread, restored when a block ends, shared by the
underflow counts and the product counts."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest

from fpsim.autograd import Tensor, use_policy
from fpsim.exact.observers import attached, backward_pass, gradients_observed
from fpsim.exact.product_count import ProductCount, count_products
from fpsim.exact.underflow import (GradientUnderflow, PerTensorUnderflow, count_gradient_underflow,
                                   count_per_tensor)

PACKAGE = Path(__file__).resolve().parents[1] / "fpsim"


def _backward():
    """A small fp16 backward pass whose gradients partly underflow: (flushed, nonzero)."""
    with use_policy("16-true"):
        x = Tensor(np.float32([1.0, 1.0, 3.0]), requires_grad=True)
        ((x * Tensor(np.float32([2.0 ** -12, 2.0 ** -2, 1.0]))) * 2.0 ** -14).sum().backward()


def _counted():
    with count_gradient_underflow() as counts:
        _backward()
    return counts.flushed, counts.nonzero, counts.values


def test_the_counts_are_observers_held_in_the_registry_for_the_block():
    assert attached(object) == ()
    with count_gradient_underflow() as counts, count_per_tensor() as leaves, \
            count_products() as products:
        kinds = [type(o) for o in attached(object)]
        assert kinds == [GradientUnderflow, PerTensorUnderflow, ProductCount]
        assert attached(ProductCount)[0] is products
        assert not gradients_observed()           # only a backward pass's roundings count
        with backward_pass():
            assert gradients_observed()
        _backward()
    assert attached(object) == () and not gradients_observed()
    assert (counts.flushed, counts.nonzero) == (1, 6) and len(leaves) == 1


def test_the_registry_is_restored_when_a_block_raises():
    with pytest.raises(RuntimeError), count_gradient_underflow():
        with backward_pass():
            raise RuntimeError("stop")
    assert attached(object) == () and not gradients_observed()


def test_nested_counters_each_count_the_passes_inside_them():
    with count_gradient_underflow() as outer:
        _backward()
        with count_gradient_underflow() as inner:
            _backward()
    assert (inner.flushed, inner.nonzero) == (1, 6)
    assert (outer.flushed, outer.nonzero) == (2, 12)


def test_observers_are_per_thread():
    alone = _counted()
    seen, ready, done = {}, threading.Event(), threading.Event()

    def other_thread():
        assert attached(object) == ()             # a new thread starts with none attached
        ready.wait()
        seen["counts"] = _counted()
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with count_gradient_underflow() as here:
        ready.set()
        done.wait()                               # the other thread's pass ran meanwhile
    worker.join()
    assert seen["counts"] == alone
    assert (here.flushed, here.nonzero, here.values) == (0, 0, 0)


def test_one_context_variable_in_the_engine_and_it_is_the_registry():
    holders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ContextVar":
                holders.append(path.relative_to(PACKAGE).as_posix())
    assert holders == ["exact/observers.py"]
