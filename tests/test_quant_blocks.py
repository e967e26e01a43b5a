"""Block-scaled quantization (``fpsim.quant.blocks``) against oracles written elsewhere:
torchao 0.18's MX reference ``to_mx`` (scales and elements bit for bit, FLOOR and RCEIL),
ml_dtypes' casts (elements) and ``float8_e8m0fnu`` (scales), and line-by-line transcriptions
of the OCP MX spec's floor rule and of Transformer Engine's ``float_to_e8m0`` and
``compute_scale_from_amax`` (scalar Python on float32 values), over generated hard blocks."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from fpsim import backend
from fpsim.formats import get
from fpsim.quant.blocks import (E8M0_NAN, MX_ELEMENT_FORMATS, TILE_FORMATS, ScaleRule,
                                dequantize, e8m0_to_float32, mx_quantize, tile_quantize)

ML_DTYPES = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
             "fp6_e2m3": ml_dtypes.float6_e2m3fn, "fp6_e3m2": ml_dtypes.float6_e3m2fn,
             "fp4_e2m1": ml_dtypes.float4_e2m1fn}
F32 = np.float32
#: FP6 / FP4 (no inf): max + half an ulp, where round to nearest even would go beyond max
#: (their max has an odd last significand bit: the tie goes up); 7.5 + 0.25, 28 + 2, 6 + 1
OVERFLOW_FROM = {"fp6_e2m3": 7.75, "fp6_e3m2": 30.0, "fp4_e2m1": 7.0}


def host(x) -> np.ndarray:
    return backend.to_numpy(x) if backend.is_array(x) else np.asarray(x)


def same_values(a, b) -> np.ndarray:
    """Elementwise: both NaN, or equal with the same sign (so +0 and -0 differ)."""
    a, b = host(a).astype(np.float64), host(b).astype(np.float64)
    return (np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))


def hard_blocks(fmt_name: str, seed: int = 0) -> np.ndarray:
    """Rows of 32 float32 values: random magnitudes over float32's range, amax at a power of
    two and at max_finite times one (and one float32 ulp either side), elements on rounding
    midpoints of the element format, saturating values, zero blocks, inf and NaN in a block,
    subnormal and tiny blocks, blocks near FLT_MAX."""
    fmt = get(fmt_name)
    rng = np.random.default_rng(seed)
    rows = []

    def add(row):
        rows.append(np.asarray(row, F32))

    for _ in range(200):      # wide random magnitudes
        add(rng.standard_normal(32) * 2.0 ** rng.integers(-150, 120))
    for k in range(-133, 128, 7):     # amax exactly 2**k, 448 * 2**k and a float32 ulp around
        for top in (2.0 ** k, fmt.max_finite * 2.0 ** (k - fmt.emax)):
            if not 2.0 ** -149 <= top < 3.4e38:
                continue
            top = F32(top)
            for amax in (np.nextafter(top, F32(0)), top, np.nextafter(top, F32(np.inf))):
                row = rng.uniform(-1, 1, 32).astype(F32) * amax
                row[rng.integers(32)] = -amax if k % 2 else amax
                add(row)
    grid = np.arange(1 << fmt.bits, dtype=np.uint8).view(ML_DTYPES[fmt_name]).astype(F32)
    grid = np.unique(grid[np.isfinite(grid) & (grid >= 0)])
    midpoints = (grid[:-1] + grid[1:]) / 2        # exact in float32
    for k in (-120, -20, 0, 3, 60, 110):          # the block's X = 2**k: max element on top
        scale = F32(2.0 ** k)
        chosen = rng.choice(midpoints, 31) * rng.choice([-1, 1], 31)
        add(np.concatenate([[fmt.max_finite], chosen]) * scale)
    for k in (-5, 0, 40):                         # saturating: amax in (max, 2**(emax+1))
        row = rng.uniform(fmt.max_finite, 2.0 ** (fmt.emax + 1), 32) * 2.0 ** k
        add(row * rng.choice([-1, 1], 32))
    add(np.zeros(32)), add(-np.zeros(32)), add(np.array([0.0, -0.0] * 16))
    for special in (np.inf, -np.inf, np.nan):
        row = rng.standard_normal(32)
        row[rng.integers(32)] = special
        add(row)
    add(np.full(32, np.nan)), add([np.inf, -np.inf] + [1.0] * 30)
    subnormals = (rng.integers(1, 1 << 23, 32).astype(np.uint32)).view(F32)
    add(subnormals), add(subnormals * rng.choice([-1, 1], 32).astype(F32))
    add(np.concatenate([subnormals[:16], rng.standard_normal(16) * 2.0 ** -100]))
    add(rng.standard_normal(32) * 2.0 ** -125), add(rng.standard_normal(32) * 2.0 ** -119)
    add(rng.uniform(-1, 1, 32) * F32(3.4028234e38)), add([3.4028234e38] + [1.0] * 31)
    return np.stack(rows).astype(F32)


# --- transcriptions (scalar Python; np.float32 arithmetic rounds as the kernels do) -------------

def spec_code(block: np.ndarray, emax: int) -> int:
    """OCP MX v1.0 section 6.3: X = 2**(floor(log2(amax)) - emax), clamped to E8M0; NaN and
    infinite amax as torchao reads them (NaN -> 0xFF, inf -> exponent field 255)."""
    amax = float(np.max(np.abs(block)))
    if math.isnan(amax):
        return E8M0_NAN
    if amax == 0:
        return 0
    exponent = 128 if math.isinf(amax) else math.frexp(amax)[1] - 1      # floor(log2), exact
    return min(max(exponent - emax + 127, 0), 254)


def te_float_to_e8m0(val: np.float32) -> int:
    """transformer_engine/common/util/ptx_arch_spec.cuh, float_to_e8m0 (the non-Blackwell
    branch, which documents cvt.rp.satfinite.ue8m0x2.f32)."""
    if np.isnan(val):
        return 0xFF
    if np.isinf(val):
        return 0xFE
    if val == 0:
        return 0
    bits = int(np.float32(val).view(np.uint32))
    exponent, mantissa = bits >> 23, bits & 0x7FFFFF
    if (mantissa > 0 and exponent != 0xFE) and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


def rceil_code(block: np.ndarray, max_finite: float) -> int:
    """TE quantize_mxfp8.cuh: fmaxf over |x| (skips NaN), then float_to_e8m0(amax *
    max_norm_rcp) with max_norm_rcp = (float)(1.0 / max_norm)."""
    amax = np.float32(0)
    for v in np.abs(block):
        amax = amax if np.isnan(v) else max(amax, v)
    return te_float_to_e8m0(np.float32(amax * np.float32(1.0 / max_finite)))


def element_oracle(x: np.ndarray, factor: np.ndarray, fmt_name: str) -> np.ndarray:
    """ml_dtypes' cast of fl32(x * factor) clamped to +-max_finite (a saturating cast); NaN
    stays NaN (ml_dtypes' FP4/FP6 casts write a zero for it: formats.py)."""
    top = F32(get(fmt_name).max_finite)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.clip(x * factor, -top, top)
        return np.where(np.isnan(scaled), scaled,
                        scaled.astype(ML_DTYPES[fmt_name]).astype(F32))


def e8m0_factor(codes: np.ndarray) -> np.ndarray:
    """1 / X from ml_dtypes' float8_e8m0fnu values (exact: powers of two)."""
    with np.errstate(divide="ignore"):
        return (F32(1) / codes.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(F32))


# --- MX ------------------------------------------------------------------------------------------

def test_every_e8m0_code_decodes_like_ml_dtypes_float8_e8m0fnu():
    codes = np.arange(256, dtype=np.uint8)
    theirs = codes.view(ml_dtypes.float8_e8m0fnu).astype(F32)
    assert same_values(e8m0_to_float32(codes), theirs).all()
    assert np.isnan(theirs[E8M0_NAN]) and theirs[0] == 2.0 ** -127 and theirs[254] == 2.0 ** 127


@pytest.mark.parametrize("fmt_name", MX_ELEMENT_FORMATS)
@pytest.mark.parametrize("rule", list(ScaleRule))
def test_mx_against_transcriptions_and_ml_dtypes(fmt_name, rule):
    fmt = get(fmt_name)
    x = hard_blocks(fmt_name)
    q = mx_quantize(x, fmt_name, scale_rule=rule)
    codes = host(q.scale_codes)[:, 0].astype(int)
    expected = [spec_code(row, fmt.emax) if rule is ScaleRule.SPEC
                else rceil_code(row, fmt.max_finite) for row in x]
    assert codes.tolist() == expected
    assert same_values(e8m0_to_float32(codes.astype(np.uint8)),
                       codes.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(F32)).all()
    oracle = element_oracle(x, e8m0_factor(codes)[:, None], fmt_name)
    oracle[codes == E8M0_NAN] = np.nan
    assert same_values(q.elements, oracle).all()
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = x * e8m0_factor(codes)[:, None]
        if fmt_name in OVERFLOW_FROM:         # no inf: what IEEE rounding would overflow
            beyond = np.abs(scaled) >= OVERFLOW_FROM[fmt_name]
        else:
            beyond = ~np.isfinite(scaled.astype(ML_DTYPES[fmt_name]).astype(F32))
    assert q.saturated == int(np.sum(beyond & ~np.isnan(scaled)))
    assert q.flushed == int(np.sum((oracle == 0) & (x != 0)))
    assert q.saturated > 0 and q.flushed > 0 and (codes == 0).any() and (codes >= 254).any()


@pytest.fixture(scope="module")
def torchao_mx():
    """torchao's MX module, its ScaleCalculationMode and torch (torchao imports it)."""
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                                    reason="torchao (0.18's MX reference to_mx) is not installed")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    import torch
    return mx_tensor, ScaleCalculationMode, torch


def torchao_elements(data: np.ndarray, fmt_name: str) -> np.ndarray:
    """torchao's MX elements as float32: FP8 as they are; FP6 one code per uint8 (the low six
    bits), FP4 two per uint8 (the first element in the low nibble), decoded by ml_dtypes."""
    if fmt_name == "fp4_e2m1":
        data = np.stack([data & 0xF, data >> 4], axis=-1).reshape(data.shape[0], -1)
    if fmt_name.startswith("fp"):
        return data.astype(np.uint8).view(ML_DTYPES[fmt_name]).astype(F32)
    return data


@pytest.mark.parametrize("fmt_name", MX_ELEMENT_FORMATS)
@pytest.mark.parametrize("rule,mode", [(ScaleRule.SPEC, "FLOOR"), (ScaleRule.RCEIL, "RCEIL")])
def test_mx_against_torchao(fmt_name, rule, mode, torchao_mx):
    """Every code and element as torchao's to_mx gives them, except where the module
    docstring says torchao differs: code-0 blocks (FLOOR divides by 2**-126, RCEIL multiplies
    by 1), NaN blocks (RCEIL: torchao's code is 0xFF; TE and here skip the NaN), and the
    elements of a 0xFF block (here NaN)."""
    x = hard_blocks(fmt_name, seed=1)
    x = np.concatenate([x, hard_blocks(fmt_name, seed=2)])
    q = mx_quantize(x, fmt_name, scale_rule=rule)
    codes, ours = host(q.scale_codes)[:, 0].astype(int), host(q.elements)
    mx_tensor, modes, torch = torchao_mx
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
             "fp4_e2m1": torch.float4_e2m1fn_x2}.get(fmt_name, fmt_name)
    theirs_codes, theirs = mx_tensor.to_mx(torch.from_numpy(x), dtype, 32, modes[mode])
    theirs_codes = theirs_codes.view(torch.uint8).numpy()[:, 0].astype(int)
    theirs = torchao_elements(theirs.numpy() if fmt_name.startswith("fp") else
                              theirs.float().numpy(), fmt_name)
    nan_block = np.isnan(x).any(axis=1)
    differs_by_design = nan_block if rule is ScaleRule.RCEIL else np.zeros(len(x), bool)
    assert (theirs_codes[differs_by_design] == E8M0_NAN).all()
    if rule is ScaleRule.RCEIL:
        # torchao's eager RCEIL takes ceil(torch.log2(amax / max_pos)) in float32: log2 of a
        # value just above 2**k (by an ulp) rounds to k, one code below cvt.rp's round-up
        with np.errstate(invalid="ignore"):
            descale = np.max(np.abs(x), axis=1) / F32(get(fmt_name).max_finite)
        log2 = torch.log2(torch.from_numpy(descale)).numpy()
        log2_rounded = (log2 == np.round(log2)) & (np.exp2(log2) != descale)
        low = ~differs_by_design & (codes != theirs_codes)
        assert (log2_rounded[low] & (theirs_codes[low] == codes[low] - 1)).all()
        assert low.any()
        differs_by_design |= low
    assert (codes == theirs_codes)[~differs_by_design].all()
    compared = (codes != 0) & (codes != E8M0_NAN) & ~differs_by_design
    assert same_values(ours[compared], theirs[compared]).all()
    assert compared.sum() > 0.75 * len(x)
    zero_code = (codes == 0) & ~differs_by_design
    torchao_factor = F32(2.0 ** 126) if rule is ScaleRule.SPEC else F32(1)
    assert same_values(theirs[zero_code],
                       element_oracle(x[zero_code], torchao_factor, fmt_name)).all()
    nan_code = codes == E8M0_NAN
    assert np.isnan(ours[nan_code]).all() and nan_code.any() == (rule is ScaleRule.SPEC)


@pytest.mark.parametrize("fmt_name", MX_ELEMENT_FORMATS)
def test_mx_along_another_axis_is_the_transpose(fmt_name):
    x = hard_blocks(fmt_name)[:64]                       # (64, 32): blocks down the columns
    along_rows = mx_quantize(np.ascontiguousarray(x.T), fmt_name)
    along_columns = mx_quantize(x, fmt_name, axis=0)
    assert host(along_columns.scale_codes).shape == (2, 32)
    assert (host(along_columns.scale_codes) == host(along_rows.scale_codes).T).all()
    assert same_values(host(along_columns.elements).T, along_rows.elements).all()
    assert same_values(host(dequantize(along_columns)).T, dequantize(along_rows)).all()


def test_mx_dequantize_is_elements_times_the_scale():
    x = hard_blocks("e4m3fn")
    q = mx_quantize(x, "e4m3fn")
    scale = host(q.scale_codes).view(ml_dtypes.float8_e8m0fnu).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = host(q.elements) * scale
    assert same_values(dequantize(q), expected).all()
    # relative to the block's amax, the error is at most the floor rule's saturation (amax /
    # X below 512, clamped to 448) where X is not clamped at 2**-127
    amax = np.abs(x).max(axis=1)
    normal = np.isfinite(x).all(axis=1) & (amax >= 2.0 ** -100) & (amax < 2.0 ** 120)
    error = np.abs(host(dequantize(q))[normal] - x[normal]) / amax[normal, None]
    assert error.max() <= 1 - 448 / 512


@pytest.mark.parametrize("bad,message", [
    (dict(x=np.zeros((4, 48), F32)), r"x.shape\[-1\] is 48; MX takes a length that is a "
                                     r"multiple of the block \(32\)"),
    (dict(x=np.zeros((48, 64), F32), axis=0), r"x.shape\[0\] is 48"),
    (dict(x=np.zeros(32, F32), fmt="fp16"),
     r"takes element formats e4m3fn, e5m2, fp6_e2m3, fp6_e3m2, fp4_e2m1; got 'fp16'"),
    (dict(x=np.zeros(32, F32), axis=1), "axis 1 is not an axis"),
    (dict(x=np.zeros(32, F32), block=0), "^mx_quantize: block must be a positive integer, got 0$"),
])
def test_mx_refuses_with_one_line(bad, message):
    with pytest.raises(ValueError, match=message):
        mx_quantize(**{"fmt": "e4m3fn", **bad})


def test_float64_is_refused_not_rounded():
    with pytest.raises(TypeError, match="float32 array"):
        mx_quantize(np.zeros(32))
    with pytest.raises(TypeError, match="float32 array"):
        tile_quantize(np.zeros((1, 128)))


# --- tiles ---------------------------------------------------------------------------------------

def te_compute_scale_from_amax(amax, max_fp8, force_pow_2_scales, epsilon):
    """transformer_engine/common/recipe/recipe_common.cuh, compute_scale_from_amax, with
    value_for_inf = FLT_MAX (float32 input), in float32."""
    amax, epsilon = np.float32(amax), np.float32(epsilon)
    if amax < epsilon:
        amax = epsilon
    if np.isinf(amax) or amax == 0 or np.isnan(amax):
        return np.float32(1)
    scale = np.float32(np.float32(max_fp8) / amax)       # __fdiv_rn
    if np.isinf(scale):
        scale = np.finfo(F32).max
    if force_pow_2_scales:
        scale = (np.asarray(scale, F32).view(np.uint32) & np.uint32(0xFF800000)).view(F32)[()]
    return np.float32(scale)


def te_tiles(x2, tile, fmt_name, power_2, epsilon):
    """Per tile (partial tiles at the ends): fmaxf amax, the scale, static_cast<OType>(x *
    scale) as a saturating cast, scale_inv = 1 / scale."""
    rows, cols = x2.shape
    tr, tc = tile
    elements, scales = np.empty_like(x2), []
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(0, rows, tr):
            scales.append([])
            for c in range(0, cols, tc):
                part = x2[r:r + tr, c:c + tc]
                amax = np.float32(np.max(np.abs(part), initial=0, where=~np.isnan(part)))
                scale = te_compute_scale_from_amax(amax, get(fmt_name).max_finite, power_2,
                                                   epsilon)
                scales[-1].append(scale)
                elements[r:r + tr, c:c + tc] = element_oracle(part, scale, fmt_name)
    return elements, np.array(scales, F32)


def tile_cases(fmt_name, rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-140, 125, (rows, 1)))
    x = x.astype(F32)
    hard = hard_blocks(fmt_name, seed).reshape(-1)
    x.reshape(-1)[:hard.size] = hard[:x.size]
    x[-1] = 0
    x[0, : cols // 2] = 2.0 ** -149                 # amax that overflows max / amax
    x[1, :3] = np.inf, 1000.0, -7.0                 # amax inf: scale 1, 1000 saturates
    x[2, :2] = np.nan, 3.0                          # NaN: skipped by the amax
    return x


@pytest.mark.parametrize("fmt_name", TILE_FORMATS)
@pytest.mark.parametrize("tile,shape", [((1, 128), (300, 256)), ((1, 128), (37, 200)),
                                        ((128, 128), (384, 256)), ((128, 128), (200, 330))])
@pytest.mark.parametrize("power_2,epsilon", [(True, 0.0), (False, 0.0), (True, 1e-12),
                                             (False, 2.0 ** -100)])
def test_tiles_against_transcription_of_te(fmt_name, tile, shape, power_2, epsilon):
    x = tile_cases(fmt_name, *shape, seed=shape[1])
    t = tile_quantize(x, fmt_name, tile, power_2=power_2, epsilon=epsilon)
    elements, scales = te_tiles(x, tile, fmt_name, power_2, epsilon)
    assert same_values(t.scales, scales).all()
    assert same_values(t.scale_inv, F32(1) / scales).all()
    assert same_values(t.elements, elements).all()
    with np.errstate(over="ignore", invalid="ignore"):
        dequantized = elements * np.kron(F32(1) / scales, np.ones(tile, F32))[:shape[0],
                                                                                :shape[1]]
    assert same_values(dequantize(t), dequantized).all()
    assert t.flushed == int(np.sum((elements == 0) & (x != 0)))
    assert t.saturated > 0 and t.flushed > 0


def test_tiles_of_a_higher_dimensional_tensor_are_tiles_of_its_2d_view():
    x = tile_cases("e4m3fn", 256, 128, seed=3)
    flat, shaped = tile_quantize(x, tile=(128, 128)), tile_quantize(x.reshape(2, 128, 128),
                                                                   tile=(128, 128))
    assert same_values(host(shaped.elements).reshape(256, 128), flat.elements).all()
    assert same_values(shaped.scales, flat.scales).all()


def test_tiles_refuse_with_one_line():
    with pytest.raises(ValueError, match=r"tile is \(rows, columns\) of positive ints"):
        tile_quantize(np.zeros((4, 4), F32), tile=(0, 128))
    with pytest.raises(ValueError, match="takes element formats e4m3fn, e5m2; got 'e4m3fnuz'"):
        tile_quantize(np.zeros((4, 4), F32), "e4m3fnuz")
