"""check-cast: framework casts (numpy float16, ml_dtypes, real torch) against round_to,
mismatches by class, every input form, and the CLI's exit codes."""
import argparse

import ml_dtypes
import numpy as np
import pytest

from fpsim import backend
from fpsim.conformance import cli
from fpsim.conformance.cast_check import CLASSES, check_cast, result_values
from fpsim.formats import get
from fpsim.quant.blocks import mx_quantize


def sources(seed=0, n=60_000):
    """Random float32 bit patterns (every class, signalling NaNs too) and values near the
    fp16/bf16/fp8 ranges and their rounding boundaries."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 20, n))).astype(np.float32)
    edges = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0,
                        2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 448.0, 464.0, 480.0,
                        57344.0, 61440.0, 2.0 ** -133, 3.4028235e38])
    return np.concatenate([bits, near, edges, -edges])


SRC = sources()


@pytest.mark.parametrize("fmt,dtype", [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16),
                                       ("e5m2", ml_dtypes.float8_e5m2),
                                       ("e4m3fn", ml_dtypes.float8_e4m3fn),
                                       ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz)])
def test_numpy_and_ml_dtypes_casts_agree_in_every_class(fmt, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = SRC.astype(dtype)
    report = check_cast(SRC, theirs, fmt)
    assert report.agree, str(report)
    assert report.total == SRC.size
    if fmt != "fp16":                   # the values of another type are not read as bits
        assert not check_cast(SRC, theirs, "fp16").agree
    assert all(report.counts[c] > 0 for c in ("normal", "subnormal", "zero", "overflow", "nan"))


@pytest.mark.parametrize("fmt,dtype", [("float4_e2m1fn", ml_dtypes.float4_e2m1fn),
                                       ("float6_e2m3fn", ml_dtypes.float6_e2m3fn),
                                       ("float6_e3m2fn", ml_dtypes.float6_e3m2fn)])
def test_fp4_fp6_casts_agree_but_for_nan_and_their_overflow_saturates(fmt, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = SRC.astype(dtype)
    report = check_cast(SRC, theirs, fmt)
    # ml_dtypes writes NaN as a zero (of the other sign); fpsim keeps it NaN (formats.py)
    assert set(report.mismatches.values()) == {0, report.mismatches["nan"]}
    assert report.mismatches["nan"] == report.counts["nan"] > 0
    assert report.counts["overflow"] > 0 and report.counts["infinity"] > 0


def test_float64_sources_are_rounded_once():
    src = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 2.0 ** -25 + 2.0 ** -60], np.float64)
    report = check_cast(src, src.astype(np.float16), "fp16")
    assert report.agree               # numpy rounds float64 -> float16 directly
    double = src.astype(np.float32).astype(np.float16)   # via float32: double rounding
    report = check_cast(src, double, "fp16")
    assert report.mismatches == {"normal": 1, "subnormal": 1, "zero": 0, "overflow": 0,
                                 "infinity": 0, "nan": 0}


def test_result_forms_values_bits_and_saved_void(tmp_path):
    with np.errstate(over="ignore", invalid="ignore"):
        bf = SRC.astype(ml_dtypes.bfloat16)
    assert check_cast(SRC, bf.astype(np.float32), "bf16").agree
    assert check_cast(SRC, bf.astype(np.float64), "bf16").agree
    assert check_cast(SRC, bf.view(np.uint16), "bf16", bits=True).agree
    assert check_cast(SRC, bf.view(np.int16), "bf16", bits=True).agree
    np.save(tmp_path / "bf.npy", bf)
    saved = np.load(tmp_path / "bf.npy")
    assert saved.dtype.kind == "V"                      # ml_dtypes' dtype is lost in .npy
    assert check_cast(SRC, saved, "bf16").agree


def test_mismatch_classes_name_what_went_wrong():
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = SRC.astype(np.float16).astype(np.float32)
    ours = theirs.copy()
    sub = np.flatnonzero((np.abs(theirs) < 2.0 ** -14) & (theirs != 0))
    theirs[sub] = np.copysign(0.0, theirs[sub])         # a flush-to-zero framework
    over = np.flatnonzero(np.isinf(theirs) & np.isfinite(SRC))
    theirs[over] = np.copysign(65504.0, theirs[over])   # a saturating one
    theirs[np.flatnonzero(np.isnan(ours))[:3]] = 0.0
    report = check_cast(SRC, theirs, "fp16", max_examples=4)
    assert report.mismatches == {"normal": 0, "subnormal": sub.size, "zero": 0,
                                 "overflow": over.size, "infinity": 0, "nan": 3}
    assert len(report.examples) == 4
    text = str(report)
    assert "mismatches" in text and f"subnormal  {report.counts['subnormal']:>10}" in text
    # the same result is right for fp16 with flushing and saturation, except the NaNs
    flushed = get("fp16").replace(subnormals=False, saturate=True)
    report = check_cast(SRC, theirs, flushed)
    assert report.mismatch_count == 3 + np.count_nonzero(np.isinf(SRC))  # inf -> max too
    assert set(CLASSES) == set(report.counts)


def test_torch_casts_agree_e4m3fn_by_its_overflow_rule():
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(SRC.copy())
    assert check_cast(SRC, t.to(torch.float16).numpy(), "fp16").agree
    assert check_cast(SRC, t.to(torch.bfloat16).view(torch.int16).numpy(), "bf16",
                      bits=True).agree
    assert check_cast(SRC, t.to(torch.float8_e5m2).float().numpy(), "e5m2").agree
    # the fnuz casts give NaN on overflow, as fpsim's default does (docs/formats-and-rounding.md)
    assert check_cast(SRC, t.to(torch.float8_e4m3fnuz).float().numpy(), "e4m3fnuz").agree
    assert check_cast(SRC, t.to(torch.float8_e5m2fnuz).float().numpy(), "e5m2fnuz").agree
    e4m3 = t.to(torch.float8_e4m3fn).float().numpy()
    report = check_cast(SRC, e4m3, "e4m3fn")
    probe = torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().item()
    if probe != probe:
        # torch before PyTorch PR #178817 (merged 2026-04-17) turns every f32 at or above
        # 480 (inf included) and every value rounding to 480 into NaN, in the scalar and the
        # AVX-512 cast alike, as ml_dtypes and fpsim's default do
        assert report.agree, str(report)
        return
    # From that PR on (torch 2.13 here) the float -> float8_e4m3fn cast saturates, inf
    # included, where ml_dtypes and the IEEE-style rule give NaN: every mismatch is an
    # overflow or infinity, none else.
    assert probe == 448.0
    assert report.mismatches["overflow"] == report.counts["overflow"] > 0
    assert report.mismatch_count == report.mismatches["overflow"] + report.counts["infinity"]
    assert check_cast(SRC, e4m3, get("e4m3fn").replace(saturate=True)).agree


@pytest.mark.parametrize("result,kwargs,error,words", [
    (np.zeros(3, np.float16), {}, ValueError, "shapes differ"),
    (np.zeros(4, np.uint16), {}, TypeError, "pass bits=True"),
    (np.zeros(4, np.uint8), {"bits": True}, TypeError, "16-bit items"),
    (np.zeros(4, np.float16), {"bits": True}, TypeError, "drop --bits"),
    (np.zeros(4, np.complex64), {}, TypeError, "float16/bfloat16"),
    (np.zeros(4, np.float16), {"mode": "stochastic"}, ValueError, "deterministic"),
])
def test_bad_input(result, kwargs, error, words):
    with pytest.raises(error, match=words):
        check_cast(np.zeros(4, np.float32), result, "fp16", **kwargs)
    with pytest.raises(TypeError, match="float32 or float64"):
        check_cast(np.zeros(4, np.int32), np.zeros(4, np.float16), "fp16")
    with pytest.raises(TypeError, match="cannot hold"):
        result_values(np.zeros(4, "V2"), "e5m2")


def parser():
    p = argparse.ArgumentParser(prog="fpsim")
    cli.register(p.add_subparsers(dest="command"))
    return p


def run(argv):
    return cli.run(parser().parse_args(argv))


def test_cli_exit_codes_and_output(tmp_path, capsys):
    src = tmp_path / "src.npy"
    np.save(src, SRC)
    with np.errstate(over="ignore", invalid="ignore"):
        np.save(tmp_path / "good.npy", SRC.astype(np.float16))
        np.save(tmp_path / "bf.npy", SRC.astype(ml_dtypes.bfloat16))
        truncated = SRC.astype(np.float16)
        bf_bits = SRC.astype(ml_dtypes.bfloat16).view(np.uint16)
    ours = truncated.astype(np.float32)
    truncated[np.abs(ours) > np.abs(SRC)] = np.nextafter(
        truncated[np.abs(ours) > np.abs(SRC)], np.float16(0))
    np.save(tmp_path / "bad.npy", truncated)
    np.save(tmp_path / "bits.npy", bf_bits)
    assert run(["check-cast", str(src), "--format", "fp16", "--against",
                str(tmp_path / "good.npy")]) == 0
    assert "all match" in capsys.readouterr().out
    assert run(["check-cast", str(src), "-f", "bf16", "--against",
                str(tmp_path / "bf.npy")]) == 0
    assert run(["check-cast", str(src), "-f", "bf16", "--against",
                str(tmp_path / "bits.npy"), "--bits"]) == 0
    capsys.readouterr()
    assert run(["check-cast", str(src), "-f", "fp16", "--against",
                str(tmp_path / "bad.npy")]) == 1
    out = capsys.readouterr().out
    assert "mismatches" in out and "first mismatches" in out
    assert run(["check-cast", str(src), "-f", "fp16", "--against",
                str(tmp_path / "bad.npy"), "--mode", "toward_zero"]) == 0
    capsys.readouterr()
    for argv, words in [
        (["-f", "fp16", "--against", str(tmp_path / "missing.npy")], "does not exist"),
        (["-f", "fp17", "--against", str(tmp_path / "good.npy")], "unknown format"),
        (["-f", "fp16", "--against", str(tmp_path / "bits.npy")], "pass bits=True"),
        (["-f", "fp16", "--against", str(tmp_path / "good.npy"), "--mode", "up-ish"],
         "deterministic"),
    ]:
        assert run(["check-cast", str(src)] + argv) == 2
        assert words in capsys.readouterr().err
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    assert run(["check-cast", str(tmp_path / "junk.npy"), "-f", "fp16", "--against",
                str(tmp_path / "good.npy")]) == 2
    assert "not a readable .npy" in capsys.readouterr().err
    np.save(tmp_path / "short.npy", SRC[:5])
    assert run(["check-cast", str(tmp_path / "short.npy"), "-f", "fp16", "--against",
                str(tmp_path / "good.npy")]) == 2
    assert "shapes differ" in capsys.readouterr().err


def test_an_in_range_value_that_rounds_to_the_maximum_stays_normal_under_saturation():
    """449 and 463 round to e4m3fn's 448 with or without saturation: normal; 465 rounds to
    480, which e4m3fn lacks: an overflow that saturation turns into 448."""
    src = np.float32([449.0, 463.0, 465.0, 1e6])
    theirs = np.float32([448.0, 448.0, 448.0, 448.0])
    report = check_cast(src, theirs, get("e4m3fn").replace(saturate=True))
    assert report.agree
    assert (report.counts["normal"], report.counts["overflow"]) == (2, 2)


def _torchao_to_mx():
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                                    reason="torchao (0.18's MX reference to_mx) is not installed")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    import torch
    return mx_tensor.to_mx, ScaleCalculationMode, torch


def mx_source(seed=0):
    """Blocks of 32 over a wide range of magnitudes, rounding midpoints and saturating
    values; no block below 2**-100 (torchao's FLOOR treats code-0 blocks differently) and no
    NaN (RCEIL's NaN blocks differ by design: fpsim.quant.blocks)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((400, 32)) * np.exp2(rng.integers(-100, 100, (400, 1)))
    x[::7, 0] *= 1.9                                         # amaxes off the power of two
    return x.astype(np.float32)


@pytest.mark.parametrize("fmt,rule,mode", [("e4m3fn", "spec", "FLOOR"), ("e5m2", "spec", "FLOOR"),
                                           ("e4m3fn", "rceil", "RCEIL")])
def test_mx_mode_checks_scales_and_elements_against_torchao(tmp_path, capsys, fmt, rule, mode):
    to_mx, modes, torch = _torchao_to_mx()
    x = mx_source()
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    scales, data = to_mx(torch.from_numpy(x), dtype, 32, modes[mode])
    codes = scales.view(torch.uint8).numpy()
    if rule == "rceil":            # torchao's float32 log2 one code low, by design: drop them
        ours = backend.to_numpy(mx_quantize(x, fmt, scale_rule="rceil").scale_codes)
        keep = (codes == ours).all(axis=1)
        x, codes, data = x[keep], codes[keep], data[torch.from_numpy(keep)]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "codes.npy", codes)
    np.save(tmp_path / "data.npy", data.float().numpy())
    argv = ["check-cast", str(tmp_path / "x.npy"), "-f", fmt, "--against",
            str(tmp_path / "data.npy"), "--mx-scales", str(tmp_path / "codes.npy"),
            "--mx-rule", rule]
    assert cli.main(argv) == 0, capsys.readouterr().out
    assert "all match" in capsys.readouterr().out.splitlines()[0]
    planted = codes.copy()
    planted[5, 0] += 1                           # an off-by-one scale choice in one block
    np.save(tmp_path / "codes.npy", planted)
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"  scales (e8m0 codes): 1 of {codes.size} blocks differ"
    assert out[2].startswith("    block (5, 0): amax ") and out[3] == (
        "  elements: 32 values in those blocks not compared")


def test_mx_mode_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    x = mx_source()[:2]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "data.npy", x)
    np.save(tmp_path / "codes.npy", np.full((2, 1), 127, np.uint8))
    np.save(tmp_path / "short.npy", np.full(2, 127, np.uint8))
    np.save(tmp_path / "wide.npy", np.full((2, 1), 127, np.uint16))
    base = ["check-cast", str(tmp_path / "x.npy"), "--against", str(tmp_path / "data.npy")]
    cases = [(["-f", "fp16", "--mx-scales", str(tmp_path / "codes.npy")], "MX elements are"),
             (["-f", "e4m3fn", "--mx-scales", str(tmp_path / "short.npy")],
              "the scales' shape is (2,); one code per block"),
             (["-f", "e4m3fn", "--mx-scales", str(tmp_path / "wide.npy")], "uint8 E8M0 codes"),
             (["-f", "e4m3fn", "--mx-scales", str(tmp_path / "codes.npy"), "--mode",
               "toward_zero"], "rounds to nearest even"),
             (["-f", "e4m3fn", "--mx-scales", str(tmp_path / "codes.npy"), "--block", "0"],
              "--block must be >= 1"),
             (["-f", "e4m3fn", "--mx-scales", str(tmp_path / "none.npy")], "does not exist")]
    before = sorted(p.name for p in tmp_path.iterdir())
    for extra, words in cases:
        assert cli.main(base + extra) == 2, extra
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
        assert words in captured.err, captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
