"""Precision policies: presets, jmp strings, errors, the context manager."""
import pytest

from fpsim.autograd import FP64, Policy, current_policy, get_policy, use_policy
from fpsim.exact.accumulation import SequentialAccumulation
from fpsim.formats import BF16, E5M2, FP16, FP32


@pytest.mark.parametrize("spec, param, matmul, wide, loss", [
    ("32-true", FP32, FP32, FP32, FP32),
    ("16-mixed", FP32, FP16, FP32, FP32),
    ("bf16-mixed", FP32, BF16, FP32, FP32),
    ("16-true", FP16, FP16, None, None),
    ("bf16-true", BF16, BF16, None, None),
    ("64-true", FP64, FP64, FP64, FP64),
])
def test_lightning_presets(spec, param, matmul, wide, loss):
    p = get_policy(spec)
    assert (p.param, p.matmul, p.wide, p.loss, p.name) == (param, matmul, wide, loss, spec)
    assert p.grad is None


@pytest.mark.parametrize("short, full", [("32", "32-true"), (32, "32-true"), ("16", "16-mixed"),
                                         (16, "16-mixed"), ("bf16", "bf16-mixed"),
                                         (" BF16-Mixed ", "bf16-mixed"), (64, "64-true")])
def test_short_forms(short, full):
    assert get_policy(short) is get_policy(full)


def test_jmp_strings():
    p = get_policy("params=float32,compute=float16,output=float32")
    assert (p.param, p.input, p.matmul, p.wide, p.elementwise, p.loss) == (
        FP32, FP16, FP16, FP16, FP16, FP32)
    q = get_policy("p=f32, c=bf16, o=bf16, grad=e5m2, accumulation=sequential:fp16")
    assert (q.param, q.matmul, q.loss, q.grad) == (FP32, BF16, BF16, E5M2)
    assert q.accumulation == SequentialAccumulation("fp16")


@pytest.mark.parametrize("bad, message", [
    ("16-mixd", "accepted: Lightning strings"),
    ("params=fp32,compute=fp16", "lacks output"),
    ("params=fp32,compute=fp17,output=fp32", "unknown format 'fp17'"),
    ("params=fp32,params=fp16,compute=fp16,output=fp32", "twice"),
    ("params=fp32,colour=red,compute=fp16,output=fp32", "bad policy part 'colour=red'"),
])
def test_invalid_strings_show_accepted_forms(bad, message):
    with pytest.raises(ValueError, match=message):
        get_policy(bad)


def test_type_errors():
    with pytest.raises(TypeError, match="a policy is a Policy or a string"):
        get_policy(1.5)
    with pytest.raises(TypeError, match="policy field 'matmul'"):
        Policy(matmul=3)
    with pytest.raises(ValueError, match="policy field 'param' needs a format"):
        Policy(param=None)


def test_replace_and_context_manager_nesting():
    base = get_policy("16-mixed")
    fp8 = base.replace(grad="e5m2")
    assert fp8.grad == E5M2 and base.grad is None and fp8.matmul == FP16
    assert current_policy().name == "32-true"
    with use_policy("16-mixed") as outer:
        assert current_policy() is outer
        with use_policy(fp8):
            assert current_policy() is fp8
        assert current_policy() is outer
    assert current_policy().name == "32-true"
    with pytest.raises(ValueError):
        with use_policy("nonsense"):
            pass
    assert current_policy().name == "32-true"
