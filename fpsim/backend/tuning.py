"""A backend's speed settings: chunk sizes and the thresholds that choose between two
computations of the same bits. They change how fast the engine runs, never a value (the
``tests/test_fast_matmul_paths.py`` and ``tests/test_optim_fast.py`` parity tests run each
path with settings that force it and compare the bits).

The defaults are the NumPy backend's, measured on x86-64 CPUs: most chunk sizes keep a
chunk's float64 temporaries in the L2 cache. A GPU backend sets its own (few, large chunks:
``GPU_TUNING``, which torch:cuda uses).
``fpsim.backend.tuning()`` gives the current backend's; ``use_tuning(**changes)`` changes some
for a block (tests, benchmarks).
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Tuning", "GPU_TUNING"]


class Tuning(NamedTuple):
    #: exact.certificate: elements per chunk of the float32 certificate (temporaries in cache)
    certificate_chunk: int = 1 << 15
    #: exact.certificate.certify_fp32_open: few, large chunks (measured faster than 2**15-17)
    certificate_open_chunk: int = 1 << 19
    #: exact.certificate: chunk size from which the einsum outer product pays its call cost
    einsum_from: int = 1 << 15
    #: exact.certificate.certify_fp32_open: open share of a chunk from which w is re-taken
    recheck_share: int = 16
    #: exact.exact_dots: float64 elements per block of the row sums (256 KiB, stays in cache)
    certified_block: int = 1 << 15
    #: exact.exact_dots: uint32 elements per block of sums and patterns (1 MiB: fewer calls)
    certified_pattern_block: int = 1 << 18
    #: exact.correctly_rounded: elements per evaluation chunk (float64 temporaries in cache)
    correctly_rounded_chunk: int = 1 << 16
    #: exact.fast_matmul: elements widened per chunk with quanta (their passes read cache)
    widen_chunk: int = 1 << 17
    #: exact.fast_matmul: times larger chunks without quanta (two passes: measured faster)
    plain_factor: int = 4
    #: exact.fast_matmul: output elements beyond K (M + N) that pay for the exact-row passes;
    #: far below zero (always try them on narrow data): the small CNN's 16-mixed step, whose
    #: first convolution (K = 9, N = 8) left 10% of its elements open at 0, measured 28.9 ->
    #: 26.3 ms with the fused kernels and 36.7 -> 35.3 ms without (open: 83,793 -> 58)
    exact_min_saving: int = -(1 << 62)
    #: exact.fast_matmul: row length from which row norms are BLAS dot products
    dot_from: int = 16
    #: exact.open_elements: nonzeros of a row up to which a zero sum is settled from its support
    support: int = 16
    #: exact.open_elements: sign probes before a zero sum's whole lines are compared
    probes: int = 8
    #: exact.open_elements: products of zero sums from which the support test pays its cost
    sparse_from: int = 1 << 12
    #: exact.norm: elements per chunk of the exact squared norm
    norm_chunk: int = 1 << 17
    #: exact.sums: rows * terms per chunk of the exact sums (bounds the scratch memory)
    sums_chunk: int = 1 << 20
    #: optim.arith: elements per chunk of the exactly rounded fused multiply-adds
    arith_chunk: int = 1 << 17
    #: optim.optimizer: parameters up to this many elements are updated together, as one
    #: flat array (fewer calls); larger ones one by one
    together_max: int = 1 << 15
    #: autograd.ops_conv: im2col elements a convolution's band unfolds (forward and dx), as a
    #: share of the larger of its input and output (memory: about 4.5 times the band's bytes)
    conv_band_share: float = 0.25
    #: autograd.ops_conv: dW's bands, both operands' elements together, as a share of the
    #: larger of the input and the output gradient (memory: about 3.5 times the band's bytes;
    #: each band's product widens its operands again: smaller bands cost time)
    conv_weight_band_share: float = 0.75
    #: autograd.ops_conv: dW on the exact model's fast path, the reduction in parts of
    #: samples: a part's gradient rows and im2col columns, float32 elements together, as a
    #: share of the larger of the input and the output gradient (their float64 copies take
    #: twice that; smaller parts cost more BLAS calls, never a bit)
    conv_weight_part_share: float = 0.25


#: few, large chunks on a GPU, where each array operation costs a kernel launch and many a
#: host synchronisation: measured on the CPU (torch), 2**24-element chunks take a
#: 784-4096-4096-10 MLP's 16-mixed step from 7821 to 1760 array operations and from 978 to
#: 133 host reads (float64 temporaries of 128 MiB a chunk at most)
GPU_TUNING = Tuning(
    certificate_chunk=1 << 24, certificate_open_chunk=1 << 24, certified_block=1 << 24,
    certified_pattern_block=1 << 24, correctly_rounded_chunk=1 << 24, widen_chunk=1 << 24,
    norm_chunk=1 << 24, sums_chunk=1 << 24, arith_chunk=1 << 24, together_max=1 << 24)
