"""Which torch the GradScaler recorders accept: >= 2.0 with the private GradScaler members
they read (``_scale``, ``_get_growth_tracker``, ``_found_inf_per_device``,
``_per_optimizer_states``) and
``Optimizer.register_step_post_hook``; anything else is refused in one line.

Only the installed torch (2.13.0 in CI) runs here; older versions are stood in for by their
version string and by scalers and optimizer classes lacking a member."""
import io

import pytest

torch = pytest.importorskip("torch", reason="the recorders need torch")

from fpsim.conformance.torch_adapter import (GradScalerAdapter,  # noqa: E402
                                             GradScalerRecorder, check_supported,
                                             unsupported_reason)


MEMBERS = ("_scale", "_get_growth_tracker", "_found_inf_per_device", "_per_optimizer_states")


class ScalerWithout:
    """A GradScaler stand-in without one of the members the recorders read."""

    def __init__(self, missing):
        for name in MEMBERS:
            if name != missing:
                setattr(self, name, None)


class OptimizerBefore2:
    """An optimizer class as torch 1.x had it: no step hooks."""


@pytest.mark.parametrize("version", ["2.0.0", "2.3.1+cpu", "2.13.0+cpu", "2.14.1", "3.0.0a0"])
def test_torch_2_0_and_later_with_the_members_are_supported(version):
    scaler = torch.amp.GradScaler("cpu")
    assert unsupported_reason(version, scaler, torch.optim.Optimizer) is None


@pytest.mark.parametrize("version", ["1.13.1", "1.6.0", "0.4.1", "nightly"])
def test_older_torch_is_refused_in_one_line(version):
    reason = unsupported_reason(version, torch.amp.GradScaler("cpu"), torch.optim.Optimizer)
    assert reason.startswith(f"torch {version} is not supported: the recorders need torch "
                             ">= 2.0") and "\n" not in reason


@pytest.mark.parametrize("missing", MEMBERS)
def test_a_scaler_without_a_member_is_refused_by_name(missing):
    reason = unsupported_reason("2.13.0", ScalerWithout(missing), torch.optim.Optimizer)
    assert f"lacks {missing}, which the recorders read" in reason


def test_an_optimizer_without_step_hooks_is_refused():
    reason = unsupported_reason("2.13.0", torch.amp.GradScaler("cpu"), OptimizerBefore2)
    assert "lacks Optimizer.register_step_post_hook" in reason


def test_the_recorder_and_adapter_check_the_installed_torch(monkeypatch):
    scaler = torch.amp.GradScaler("cpu")
    check_supported(scaler)                            # the installed torch passes
    GradScalerRecorder(scaler, io.StringIO()).close()
    monkeypatch.setattr(torch, "__version__", "1.13.1")
    with pytest.raises(ValueError, match=r"^torch 1\.13\.1 is not supported"):
        GradScalerRecorder(torch.amp.GradScaler("cpu"), io.StringIO())
    with pytest.raises(ValueError, match=r"^torch 1\.13\.1 is not supported"):
        GradScalerAdapter()
