"""NVFP4 (``fpsim.quant.nvfp4``) against code we did not write: torchao 0.18's NVFP4Tensor on
the CPU (scales, elements and dequantized values bit for bit), a line-by-line transcription of
Transformer Engine's reference quantizer (``reference_nvfp4.py``,
``_quantize_blockwise_reference`` and ``cast_to_fp4x2``; TE does not run on a CPU), ml_dtypes'
e4m3fn and float4_e2m1fn for the values; where TE and torchao differ, the difference pinned."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fpsim import backend, round_to
from fpsim.quant.nvfp4 import (TE_WGRAD_SIGNS, NVFP4Rule, hadamard_matrix, nvfp4_dequantize,
                               nvfp4_quantize, random_hadamard_transform)

F32 = np.float32
FP4_VALUES = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)


def host(x) -> np.ndarray:
    return backend.to_numpy(x) if backend.is_array(x) else np.asarray(x)


def hard_matrix(rows: int = 64, cols: int = 128, seed: int = 0) -> np.ndarray:
    """Rows of wide-ranging magnitudes, blocks whose scaled elements sit on FP4 midpoints,
    zero blocks, negative zeros, a block with one large outlier, subnormal blocks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-20, 20, (rows, 1)))
    midpoints = (FP4_VALUES[1:8] + FP4_VALUES[:7]) / 2
    x[0, :16] = np.concatenate([[6.0], rng.choice(midpoints, 15)]) * rng.choice([-1, 1], 16)
    x[1, :16], x[1, 16:32] = 0.0, -0.0
    x[2, :16] = rng.standard_normal(16) * 1e-3
    x[2, 5] = 1e3
    x[3, :16] = rng.standard_normal(16) * 2.0 ** -140
    return x.astype(F32)


# --- torchao -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torchao_nvfp4():
    module = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor",
                                 reason="torchao (0.18's NVFP4Tensor) is not installed")
    import torch
    return module, torch


def torchao_quantize(x: np.ndarray, torchao_nvfp4):
    """torchao's two-level NVFP4 of x: (scales, elements, dequantized) as float32."""
    module, torch = torchao_nvfp4
    t = torch.from_numpy(x)
    per_tensor = module.per_tensor_amax_to_scale(torch.max(torch.abs(t)))
    q = module.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=per_tensor)
    scales = q.scale.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(F32)
    packed = q.qdata.view(torch.uint8).numpy()          # first element in the low nibble
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(x.shape)
    return scales, FP4_VALUES[codes], q.dequantize(torch.float32).numpy()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torchao_rule_matches_torchao_bit_for_bit(seed, torchao_nvfp4):
    x = hard_matrix(seed=seed)
    ours = nvfp4_quantize(x, rule="torchao")
    scales, elements, dequantized = torchao_quantize(x, torchao_nvfp4)
    assert np.array_equal(host(ours.scales).view(np.uint32), scales.view(np.uint32))
    assert np.array_equal(host(ours.elements).view(np.uint32), elements.view(np.uint32))
    assert np.array_equal(host(nvfp4_dequantize(ours)).view(np.uint32),
                          dequantized.view(np.uint32))
    assert ours.flushed > 0 and (host(ours.scales) == 2.0 ** -6).any()   # torchao's floor


def test_torchao_gives_an_all_zero_tensor_nan_scales(torchao_nvfp4):
    x = np.zeros((2, 32), F32)
    scales, elements, dequantized = torchao_quantize(x, torchao_nvfp4)
    ours = nvfp4_quantize(x, rule=NVFP4Rule.TORCHAO)
    # p = 0: 0 / 0 is NaN; torchao's FP4 cast writes NaN as -2.0 here (its normal branch's
    # bits), fpsim keeps NaN; dequantized, both are NaN
    assert np.isnan(scales).all() and np.isnan(host(ours.scales)).all()
    assert (elements == -2.0).all() and np.isnan(host(ours.elements)).all()
    assert np.isnan(dequantized).all() and np.isnan(host(nvfp4_dequantize(ours))).all()
    te = nvfp4_quantize(x)                          # TE: zero scales, zero elements
    assert (host(te.scales) == 0).all() and (host(nvfp4_dequantize(te)) == 0).all()


# --- Transformer Engine's reference, transcribed --------------------------------------------

def te_cast_to_fp4(x: np.ndarray) -> np.ndarray:
    """reference_nvfp4.py, cast_to_fp4x2 (before packing): the bins of round to nearest even
    written as comparisons; -0 and NaN match none of the negative bins and give +0."""
    codes = np.zeros(x.shape, np.uint8)
    bins = [((x >= 0.0) & (x <= 0.25), 0), ((x > 0.25) & (x < 0.75), 1),
            ((x >= 0.75) & (x <= 1.25), 2), ((x > 1.25) & (x < 1.75), 3),
            ((x >= 1.75) & (x <= 2.5), 4), ((x > 2.5) & (x < 3.5), 5),
            ((x >= 3.5) & (x <= 5.0), 6), (x > 5.0, 7),
            ((x >= -0.25) & (x < -0.0), 8), ((x < -0.25) & (x > -0.75), 9),
            ((x <= -0.75) & (x >= -1.25), 10), ((x < -1.25) & (x > -1.75), 11),
            ((x <= -1.75) & (x >= -2.5), 12), ((x < -2.5) & (x > -3.5), 13),
            ((x <= -3.5) & (x >= -5.0), 14), (x < -5.0, 15)]
    for where, code in bins:
        codes[where] = code
    return FP4_VALUES[codes]


def te_reference(x: np.ndarray, tile: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_quantize_blockwise_reference (pow_2_scales False, no 4over6, one global amax), each
    torch float32 operation as a NumPy float32 one: (decode scales, elements, the scaled
    elements clamped to +-6 before the cast)."""
    m, n = x.shape
    if tile == (16, 16):
        blocks = np.abs(x).reshape(m // 16, 16, n // 16, 16).max(axis=(1, 3))
        vec_max = np.repeat(blocks, 16, axis=0)[..., None]
    else:
        vec_max = np.abs(x).reshape(m, n // 16, 16).max(axis=-1, keepdims=True)
    global_amax = np.max(np.abs(x))
    with np.errstate(divide="ignore", over="ignore"):
        global_encode_scale = np.minimum(F32(448.0) * F32(6.0) / global_amax,
                                         F32(np.finfo(F32).max))
        if global_encode_scale == 0:
            global_encode_scale = F32(1.0)
        global_decode_scale = F32(1.0) / global_encode_scale
        multiplier = global_encode_scale * np.reciprocal(F32(6.0))
        decode_scale = np.minimum(vec_max * multiplier, F32(np.finfo(F32).max))
        decode_scale = np.clip(decode_scale, F32(-448.0), F32(448.0))
        decode_scale = decode_scale.astype(ml_dtypes.float8_e4m3fn).astype(F32)
        encode_scale = np.minimum(F32(1.0) / (decode_scale * global_decode_scale),
                                  F32(np.finfo(F32).max))
        scaled = x.reshape(m, n // 16, 16) * encode_scale
    clipped = np.clip(scaled, F32(-6.0), F32(6.0)).reshape(m, n)
    return decode_scale[..., 0], te_cast_to_fp4(clipped), clipped


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("seed", [0, 1])
def test_te_rule_matches_the_transcribed_reference(tile, seed):
    x = hard_matrix(seed=seed)
    ours = nvfp4_quantize(x, tile=tile, rule="te")
    scales, elements, _ = te_reference(x, tile)
    assert np.array_equal(host(ours.scales).view(np.uint32), scales.view(np.uint32))
    got = host(ours.elements)
    negative_zero = (got == 0) & np.signbit(got)      # the reference's cast writes +0
    assert np.array_equal(got[~negative_zero].view(np.uint32),
                          elements[~negative_zero].view(np.uint32))
    assert (elements[negative_zero] == 0).all() and negative_zero.any()
    if tile == (16, 16):          # one scale per 16x16 tile, on each of its rows
        assert (host(ours.scales).reshape(4, 16, -1) == host(ours.scales)[::16, None]).all()


def test_te_and_torchao_scale_arithmetic_differ_at_an_e4m3_tie_and_at_the_floor():
    x = np.zeros((3, 16), F32)
    x[0, 0], x[1, 0], x[2, 0] = 100.0, F32(24.107141), 1e-4   # tensor amax 100
    te, torchao = nvfp4_quantize(x, rule="te"), nvfp4_quantize(x, rule="torchao")
    te_scales, torchao_scales = host(te.scales)[:, 0], host(torchao.scales)[:, 0]
    # 24.107141 * 448 / 100 is near the e4m3 midpoint 108: TE's fl32(amax * fl32(S_enc *
    # fl32(1/6))) lands below it, torchao's fl32(fl32(amax / 6) / p) above
    assert te_scales[:2].tolist() == [448.0, 104.0] and torchao_scales[:2].tolist() == [448.0,
                                                                                       112.0]
    # 1e-4 * 4.48 is below e4m3's smallest normal: TE keeps the subnormal scale, torchao
    # floors it at 2**-6
    assert te_scales[2] == round_to(F32(1e-4) * F32(4.48), "e4m3fn") < 2.0 ** -6
    assert torchao_scales[2] == 2.0 ** -6


def test_te_dequantizes_with_its_kernel_arithmetic():
    x = hard_matrix(seed=3)
    q = nvfp4_quantize(x)
    amax = F32(np.max(np.abs(x)))
    factor = (host(q.scales) * amax) * F32(1.0 / 2688.0)   # dequantize_fp4_kernel
    expected = host(q.elements).reshape(64, -1, 16) * factor[..., None]
    assert np.array_equal(host(nvfp4_dequantize(q)), expected.reshape(64, 128))


# --- rounding: nearest even and stochastic ----------------------------------------------------

def test_saturated_and_flushed_counts():
    x = np.zeros((1, 16), F32)
    x[0, :3] = [1e-9, 6.0, -2.0]
    q = nvfp4_quantize(x)
    # an e4m3 scale rounded down leaves the block amax at most 6 * 17/16 < 7: none saturates
    assert q.flushed == 1 and q.saturated == 0
    assert host(q.elements)[0, :3].tolist() == [0.0, 6.0, -2.0]


def test_stochastic_rounding_is_reproducible_and_picks_a_neighbour():
    x = hard_matrix(seed=4)
    first = nvfp4_quantize(x, mode="stochastic", seed=7, offset=11)
    again = nvfp4_quantize(x, mode="stochastic", seed=7, offset=11)
    other = nvfp4_quantize(x, mode="stochastic", seed=8, offset=11)
    nearest = nvfp4_quantize(x)
    got = host(first.elements)
    assert np.array_equal(got.view(np.uint32), host(again.elements).view(np.uint32))
    assert not np.array_equal(got, host(other.elements))
    assert np.array_equal(host(first.scales), host(nearest.scales))    # scales: no rounding
    scaled = _scaled(x)
    below, above = round_to(scaled, "fp4", "down"), round_to(scaled, "fp4", "up")
    assert ((got == below) | (got == above)).all()
    assert (got != host(nearest.elements)).any()


def _scaled(x: np.ndarray) -> np.ndarray:
    """TE's scaled elements before the FP4 cast (the transcription's), clamped to +-6."""
    return te_reference(x, (1, 16))[2]


def test_stochastic_rounding_is_unbiased_on_a_repeated_value():
    x = np.full((256, 16), 2.0, F32)
    x[:, 0] = 6.0                       # scale 1: the other elements stay 2.4 = 6 * 0.4
    x[:, 1:] = 2.4
    q = nvfp4_quantize(x, mode="stochastic", seed=1)
    values = host(q.elements)[:, 1:]
    assert set(np.unique(values).tolist()) == {2.0, 3.0}
    assert abs(values.mean() - 2.4) < 0.03


# --- random Hadamard transform ----------------------------------------------------------------

def test_hadamard_matrix_is_te_signs_times_sylvester_and_orthogonal():
    h = host(hadamard_matrix())
    assert (h @ h.T == np.eye(16)).all()
    sylvester = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)]
                          for i in range(16)])
    assert (h == np.array(TE_WGRAD_SIGNS)[:, None] * sylvester * 0.25).all()


def test_transform_is_the_exact_sum_rounded_once():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((32, 64)) * np.exp2(rng.integers(-6, 6, (32, 64)))).astype(F32)
    got = host(random_hadamard_transform(x))
    # float64 holds these sums exactly (exponents within 2**12 of each other, 24-bit values)
    exact = x.astype(np.float64).reshape(-1, 16) @ host(hadamard_matrix()).astype(np.float64)
    assert np.array_equal(got, exact.astype(F32).reshape(32, 64))


def test_transforms_of_both_wgrad_operands_cancel_in_the_product():
    rng = np.random.default_rng(6)
    a = rng.integers(-8, 8, (4, 32)).astype(F32)     # small integers: every sum exact
    b = rng.integers(-8, 8, (32, 3)).astype(F32)
    a_rotated = host(random_hadamard_transform(a))                      # (A H)
    b_rotated = host(random_hadamard_transform(np.ascontiguousarray(b.T))).T    # (H^T B)
    assert np.array_equal(a_rotated @ b_rotated, a @ b)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,message", [
    (lambda: nvfp4_quantize(np.zeros((2, 20), F32)), ValueError,
     r"^nvfp4_quantize: x has shape \(2, 20\); 1x16 tiles take columns a multiple of 16"),
    (lambda: nvfp4_quantize(np.zeros((8, 16), F32), tile=(16, 16)), ValueError,
     r"rows a multiple of 16$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), tile=(1, 32)), ValueError,
     r"^tile must be \(1, 16\) or \(16, 16\), got \(1, 32\)$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), rule="cublas"), ValueError,
     r"^unknown rule 'cublas'; accepted: te, torchao$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), mode="up"), ValueError,
     r"^unknown mode 'up'; accepted: nearest_even, stochastic$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), mode="stochastic"), ValueError,
     r"^mode=.stochastic. needs seed=int \(with optional offset=\), so that runs repeat$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), seed=1), ValueError,
     r"^seed and offset are only used by mode=.stochastic.$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), F32), mode="stochastic", seed=-1), ValueError,
     r"^seed must be an integer from 0 to 18446744073709551615, got -1$"),
    (lambda: nvfp4_quantize(np.zeros((2, 16), np.float64)), TypeError,
     r"^nvfp4_quantize takes a 2-D float32 array, got float64 of 2 dimensions$"),
    (lambda: nvfp4_quantize(np.zeros(16, F32)), TypeError, r"of 1 dimensions$"),
    (lambda: random_hadamard_transform(np.zeros((2, 8), F32)), ValueError,
     r"^random_hadamard_transform: the last axis of shape \(2, 8\) is not a multiple of 16$"),
    (lambda: hadamard_matrix([1] * 15), ValueError, r"^signs must be 16 values, each 1 or -1"),
    (lambda: nvfp4_dequantize("q"), TypeError, r"^nvfp4_dequantize takes an NVFP4Tensor"),
])
def test_bad_input_is_one_sentence(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_torch_backend_gives_the_same_bits():
    pytest.importorskip("torch", reason="the torch backend needs PyTorch")
    x = hard_matrix(seed=6)
    expected = [nvfp4_quantize(x, tile=(16, 16)), nvfp4_quantize(x, rule="torchao"),
                nvfp4_quantize(x, mode="stochastic", seed=9, offset=2)]
    rotated = random_hadamard_transform(x)
    dequantized = [host(nvfp4_dequantize(q)) for q in expected]
    with backend.use_backend("torch"):
        on_torch = backend.asarray(x, backend.xp.float32)
        got = [nvfp4_quantize(on_torch, tile=(16, 16)),
               nvfp4_quantize(on_torch, rule="torchao"),
               nvfp4_quantize(on_torch, mode="stochastic", seed=9, offset=2)]
        for ours, theirs, values in zip(got, expected, dequantized):
            for field in ("elements", "scales"):
                assert np.array_equal(host(getattr(ours, field)).view(np.uint32),
                                      host(getattr(theirs, field)).view(np.uint32))
            assert np.array_equal(host(nvfp4_dequantize(ours)).view(np.uint32),
                                  values.view(np.uint32))
        assert np.array_equal(host(random_hadamard_transform(on_torch)), host(rotated))
