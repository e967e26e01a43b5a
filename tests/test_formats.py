"""Format constants, against NumPy's and ml_dtypes' finfo (oracles we did not write)."""
import ml_dtypes
import numpy as np
import pytest

from fpsim import formats
from fpsim.formats import (BF16, E2M1, E2M3, E3M2, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, FP16, FP32,
                           TF32, custom)

FINFO_ORACLES = [
    (FP32, np.float32), (FP16, np.float16), (BF16, ml_dtypes.bfloat16),
    (E4M3FN, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2),
    (E4M3FNUZ, ml_dtypes.float8_e4m3fnuz), (E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
    (custom(4, 3), ml_dtypes.float8_e4m3), (custom(3, 4), ml_dtypes.float8_e3m4),
    (E2M1, ml_dtypes.float4_e2m1fn), (E2M3, ml_dtypes.float6_e2m3fn),
    (E3M2, ml_dtypes.float6_e3m2fn),
]


@pytest.mark.parametrize("fmt,dtype", FINFO_ORACLES, ids=lambda v: getattr(v, "name", ""))
def test_constants_match_finfo(fmt, dtype):
    info = ml_dtypes.finfo(dtype) if dtype not in (np.float16, np.float32) else np.finfo(dtype)
    assert fmt.max_finite == float(info.max)
    assert fmt.min_normal == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)
    assert fmt.man_bits == info.nmant
    assert fmt.bits == info.bits
    assert fmt.precision == info.nmant + 1
    assert fmt.emin == info.minexp


def test_exact_hex_constants():
    assert FP16.max_finite == float.fromhex("0x1.ffcp15")
    assert BF16.max_finite == float.fromhex("0x1.fep127")
    assert TF32.max_finite == float.fromhex("0x1.ffcp127")
    assert E4M3FN.max_finite == 448.0 and E4M3FNUZ.max_finite == 240.0
    assert E5M2.max_finite == 57344.0 and E5M2FNUZ.max_finite == 57344.0
    assert FP16.smallest_subnormal == float.fromhex("0x1p-24")
    assert (FP16.emin, FP16.emax, BF16.emin, BF16.emax) == (-14, 15, -126, 127)


@pytest.mark.parametrize("name,expected", [
    ("fp16", FP16), ("float16", FP16), ("half", FP16), ("  FP16 ", FP16), ("bf16", BF16),
    ("bfloat16", BF16), ("tf32", TF32), ("e4m3", E4M3FN), ("fp8_e4m3fn", E4M3FN),
    ("float8-e4m3fn", E4M3FN), ("e5m2", E5M2), ("e4m3fnuz", E4M3FNUZ), ("fp32", FP32),
    ("e5m10", FP16), ("e8m7", BF16), ("e8m23", FP32),
])
def test_get_accepts_what_users_type(name, expected):
    assert formats.get(name) == expected


def test_custom_names_and_layouts():
    f = formats.get("e3m4")
    assert (f.exp_bits, f.man_bits, f.bias, f.encoding, f.name) == (3, 4, 3, "ieee", "e3m4")
    assert formats.get("e4m3fnuz") == custom(4, 3, encoding="fnuz")
    assert formats.get("e5m10") is not FP16 and formats.get("e5m10").name == "e5m10"
    assert hash(formats.get("e5m10")) == hash(FP16)
    assert FP16.replace(subnormals=False) != FP16


@pytest.mark.parametrize("bad", ["fp17", "float", "", "e9m3", "e4m0", "e1m3", "e5m24", "int8"])
def test_unknown_names_list_accepted(bad):
    with pytest.raises(ValueError) as err:
        formats.get(bad)
    message = str(err.value)
    assert repr(bad) in message
    assert "fp16" in message or "exp_bits" in message or "man_bits" in message


def test_get_rejects_non_strings():
    with pytest.raises(TypeError, match="Format or a name"):
        formats.get(16)


@pytest.mark.parametrize("kwargs,match", [
    (dict(exp_bits=9, man_bits=3), "exp_bits"), (dict(exp_bits=5, man_bits=0), "man_bits"),
    (dict(exp_bits=5, man_bits=24), "man_bits"), (dict(exp_bits=5, man_bits=2, bias=-120),
                                                  "float32's range"),
    (dict(exp_bits=5, man_bits=2, encoding="posit"), "encoding"),
])
def test_custom_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        custom(**kwargs)


def test_format_is_frozen():
    with pytest.raises(AttributeError):
        FP16.man_bits = 9  # type: ignore[misc]
