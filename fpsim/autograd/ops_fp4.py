"""The operands of ``linear`` under the ``nvfp4`` recipe (``ops_fp8`` runs the GEMMs).

Transformer Engine's ``NVFP4BlockScaling`` (``transformer_engine/common/recipe/__init__.py``:
its ``QParams`` per tensor; ``docs/features/low_precision_training/nvfp4/nvfp4.rst``) and the
NVIDIA paper ("Pretraining Large Language Models with NVFP4", 2025) quantize each operand
along the reduction dimension of the GEMM it feeds (``fpsim.quant.nvfp4_quantize``, TE's
arithmetic)::

    forward  y  = x @ w.T    x: 1x16 blocks, nearest even; w: 16x16 tiles (2d=0: 1x16), nearest
    dgrad    dx = g @ w      g: 1x16 along out, stochastic (sr=0: nearest); w: the forward's
                             16x16 tiles transposed (the same values: one scale per tile), with
                             2d=0 quantized again in 1x16 blocks along out
    wgrad    dw = g.T @ x    g.T and x.T (rows of tokens): the 16x16 random Hadamard transform
                             along the tokens (rht=0: none), then 1x16 blocks; g stochastic

The GEMM multiplies the block-decoded operands (element times its E4M3 block scale: exact in
float32, 2 significant bits times 4), accumulates as the recipe's ``acc`` says (default: each
dot product exact, rounded once to fp32, as the FP8 GEMMs), and applies the two per-tensor
scales in one fp32 factor, TE's ``alpha = amax_A * amax_B * fl32(1 / (6*6*448*448))``
(``common/recipe/nvfp4.cu``, ``compute_nvfp4_per_tensor_scale_kernel``, left to right).

Stochastic rounding draws Philox counters under the GEMM's key: each stochastic cast takes the
next ``size`` counters of its ``ScalingSlots`` (``sr_seed``, ``sr_offset``), so two casts never
share a draw; the offset is extra state that checkpoints save, so a resumed run draws what the
uninterrupted one drew (``fpsim.train`` keys each GEMM by the run's seed and its name). TE's
kernels draw on the GPU (``cvt.rs``), which no CPU reproduces: the distribution is the same,
the draws are fpsim's. TE's Hadamard signs are fixed (``reference_nvfp4.py``,
``get_wgrad_sign_vector``; its documentation describes signs redrawn each step, which its
reference does not do): here the reference's.
"""
from __future__ import annotations

from ..backend import size, xp
from ..quant.nvfp4 import nvfp4_quantize, random_hadamard_transform
from ..quant.tensor_scaling import FLT_MAX, fl32

__all__ = ["WGRAD_ROLES", "nvfp4_operand", "nvfp4_alpha", "global_scale"]

#: the statistics' names of the weight-gradient GEMM's own casts (after the transform)
WGRAD_ROLES = ("wgrad_input", "wgrad_grad_output")
_BLOCK = 16
_FACTOR_INV = fl32(1.0 / (6.0 * 6.0 * 448.0 * 448.0))      # TE: constexpr float factor_inv


def global_scale(amax: float) -> float:
    """TE's per-tensor encode scale ``min(fl32(2688 / amax), FLT_MAX)``, 1 where that is 0
    (the ``scale`` the statistics record)."""
    if amax == 0.0:
        return FLT_MAX
    scale = min(fl32(2688.0 / amax), FLT_MAX)
    return 1.0 if scale == 0.0 else scale


def nvfp4_alpha(amax_a: float, amax_b: float) -> float:
    """The GEMM's fp32 factor from the operands' amaxes (module doc)."""
    return fl32(fl32(amax_a * amax_b) * _FACTOR_INV)


def nvfp4_operand(slots, role: str, data, recipe, axis: int):
    """``data`` (2-D float32) quantized as GEMM operand ``role`` reduced along ``axis`` (-1:
    rows, 0: columns, the wgrad operands and 2d=0's dgrad weight): ``(block-decoded values in
    data's shape, amax, the NVFP4Tensor, the statistics' role)``."""
    columns = axis in (0, -2)
    rows = data.T if columns else data
    wgrad = columns and role != "weight"
    if wgrad and recipe.rht:
        rows = random_hadamard_transform(rows)
    tile = (_BLOCK, _BLOCK) if role == "weight" and recipe.tiles_2d else (1, _BLOCK)
    options = (slots.draw_stochastic(size(rows))
               if role == "grad_output" and recipe.stochastic else {})
    q = nvfp4_quantize(rows, tile=tile, **options)
    height, width = rows.shape
    blocks = xp.reshape(q.elements, (height, width // _BLOCK, _BLOCK))
    decoded = xp.reshape(blocks * xp.expand_dims(q.scales, -1), (height, width))
    return (decoded.T if columns else decoded), float(q.amax), q, \
        (f"wgrad_{role}" if wgrad else role)
