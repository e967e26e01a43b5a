"""Scaled quantization for FP8 training recipes: the scales, casts and their state.

A quantized GEMM operand is ``q = round_sat(fl32(x * scale), fmt)``: the value times a scale,
rounded once to float32 (the multiply of the cast kernel), then once to the FP8 format with
saturation; the GEMM divides the scales back out. What differs between recipes is where the
scale comes from:

- ``tensor_scaling``: one scale per tensor, from this tensor's amax (current scaling) or from
  an amax history kept across steps (delayed scaling), as NVIDIA Transformer Engine's
  ``Float8CurrentScaling`` and ``DelayedScaling`` recipes compute them: ``amax``,
  ``scale_from_amax``, ``quantize`` (-> ``Quantized``), ``DelayedScalingState`` with
  ``init_delayed``, ``record_amax``, ``update_delayed``;
- ``blocks``: one scale per block of elements: OCP Microscaling (MX, power-of-two e8m0 scales
  per 32 elements; FP8, FP6 or FP4 elements) and 1x128 / 128x128 tiles with float32 scales
  (``Float8BlockScaling``): ``mx_quantize`` (-> ``MXTensor``, the scale rule a ``ScaleRule``),
  ``tile_quantize`` (-> ``TileTensor``), ``dequantize`` of either, ``e8m0_to_float32``;
- ``nvfp4``: NVFP4, FP4 elements in 1x16 or 16x16 blocks with E4M3 scales and a per-tensor
  scale, as Transformer Engine or torchao compute them (``NVFP4Rule``), nearest even or
  stochastic: ``nvfp4_quantize`` (-> ``NVFP4Tensor``), ``nvfp4_dequantize``, and the random
  Hadamard transform of the weight-gradient GEMM's operands (``random_hadamard_transform``).

``recipe`` parses the recipe strings (``get_recipe("fp8-delayed:history=16")`` -> ``Fp8Recipe``)
that ``fpsim.autograd.get_policy`` accepts.

This layer sits between ``exact`` and ``autograd``: plain arrays in, arrays and frozen state
out; the engine's quantized ops (``autograd``) and the recipe strings build on it.
"""
from .blocks import (E8M0_NAN, MX_ELEMENT_FORMATS, TILE_FORMATS, MXTensor, ScaleRule,
                     TileTensor, dequantize, e8m0_to_float32, mx_quantize, tile_quantize)
from .nvfp4 import (NVFP4_TILES, NVFP4Rule, NVFP4Tensor, nvfp4_dequantize, nvfp4_quantize,
                    random_hadamard_transform)
from .recipe import Fp8Recipe, ScalingKind, get_recipe
from .tensor_scaling import (AmaxAlgorithm, DelayedScalingState, Quantized, amax,
                             count_saturated, init_delayed, quantize, record_amax,
                             scale_from_amax, update_delayed)

__all__ = ["ScaleRule", "MXTensor", "TileTensor", "MX_ELEMENT_FORMATS", "TILE_FORMATS",
           "E8M0_NAN", "mx_quantize", "tile_quantize", "dequantize", "e8m0_to_float32",
           "Fp8Recipe", "ScalingKind", "get_recipe", "AmaxAlgorithm", "DelayedScalingState",
           "Quantized", "amax", "count_saturated", "init_delayed", "quantize", "record_amax",
           "scale_from_amax", "update_delayed", "NVFP4_TILES", "NVFP4Rule", "NVFP4Tensor",
           "nvfp4_quantize", "nvfp4_dequantize", "random_hadamard_transform"]
