"""How often the exact model's products took each path: a counter for benchmarks and tests.

``with count_products() as counts:`` counts, for the fp32-accumulator products inside, the
matrix products the fast paths (``fast_matmul``: 2-D and batched) took, their elements left
open by the fp32 certificate and those summed exactly, and the products the general path
(``exact_dots.exact_matmul``) took with its limb sums. A ``ProductCount`` is an observer
(``fpsim.exact.observers``): the block attaches one. Outside such a block nothing is counted
(one read of the observer registry per product).
"""
from __future__ import annotations

from dataclasses import dataclass

from .observers import attached, observing

__all__ = ["ProductCount", "count_products", "note_fast", "note_general"]


@dataclass
class ProductCount:
    """The exact model's fp32 products in a ``count_products()`` block. Fast paths
    (``matmul_2d``, ``matmul_batched``): ``fast`` products of ``elements`` output elements,
    ``open`` of them left open by the fp32 certificate (and the exact rows), ``exact`` of
    those summed exactly (the rest settled at the output format's level). The general path
    (``exact_dots.exact_matmul``, as ``accumulation.matmul`` reports it): ``general``
    products of ``general_elements`` elements, ``general_exact`` of them summed with limbs."""

    fast: int = 0
    elements: int = 0
    open: int = 0
    exact: int = 0
    general: int = 0
    general_elements: int = 0
    general_exact: int = 0


def count_products():
    """``with count_products() as counts:``: the products inside add to ``counts``
    (a ``ProductCount``); outside such a block nothing is counted."""
    return observing(ProductCount())


def note_fast(products: int, elements: int, opened: int, exact: int) -> None:
    """Count products a fast path took (``ProductCount``)."""
    for counts in attached(ProductCount):
        counts.fast += products
        counts.elements += elements
        counts.open += opened
        counts.exact += exact


def note_general(products: int, elements: int, exact: int) -> None:
    """Count products the general path took (``ProductCount``)."""
    for counts in attached(ProductCount):
        counts.general += products
        counts.general_elements += elements
        counts.general_exact += exact
