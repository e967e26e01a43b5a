"""Replay and adapter comparison: every preset agrees with itself through the machinery, and a
scaler that differs in one rule is caught at the exact step, with both states shown."""
import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import find, given, settings

from fpsim.conformance import (ReferenceAdapter, Trace, TraceHeader, TraceStep, compare,
                               read_trace, record, replay, standard_patterns, write_trace)
from fpsim.conformance.adapters import AdapterError
from fpsim.conformance.strategies import (bursts, clean_runs, collapses, growth_to_limit,
                                          overflow_patterns, random_flags)
from fpsim.scaling import LossScaleMinimumError, preset, preset_names


class TorchLikeScaler:
    """A torch-style scaler written from scratch, as a user would (docs/check-a-framework.md
    writes one)."""

    def __init__(self, growth_interval=2000, off_by_one=False, clamp_min=False):
        self.scale, self.interval, self.clean = 2.0 ** 16, growth_interval, 0
        self.off_by_one, self.clamp_min = off_by_one, clamp_min

    def update(self, found_inf):
        with np.errstate(over="ignore", under="ignore"):
            if found_inf:
                self.scale, self.clean = float(np.float32(self.scale * 0.5)), 0
                if self.clamp_min:
                    self.scale = max(self.scale, 2.0 ** -120)
            else:
                self.clean += 1
                if self.clean == self.interval + self.off_by_one:
                    grown = float(np.float32(self.scale * 2.0))
                    self.scale = grown if math.isfinite(grown) else self.scale
                    self.clean = 0
        return self.scale

    def state(self):
        return {"growth_tracker": self.clean}


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_agrees_with_itself_on_standard_patterns(name):
    for label, flags in standard_patterns(name, growth_interval=4):
        report = compare(ReferenceAdapter(name, growth_interval=4), flags, name,
                         growth_interval=4)
        assert report.agree, (label, str(report))
        expected = len(flags)
        if name == "deepspeed":               # stops where DeepSpeed raises at its minimum
            assert "both stopped" in report.note or report.steps_compared == expected
        else:
            assert report.steps_compared == expected


def test_presets_differ_where_their_quirks_say():
    # apex caps the scale at 2**24: growth from 2**16 by 2 hits it after 8 growths.
    report = compare(ReferenceAdapter("apex", growth_interval=1), [False] * 20, "torch",
                     growth_interval=1)
    assert not report.agree and report.divergence.step == 8
    assert report.divergence.fields == ("scale_after",)
    assert report.divergence.recorded["scale_after"] == 2.0 ** 24
    assert report.divergence.expected["scale_after"] == 2.0 ** 25
    # tf-keras floors the backoff at 1; torch does not.
    flags = [True] * 20
    report = compare(ReferenceAdapter("tf-keras", init_scale=8.0), flags, "torch",
                     init_scale=8.0)
    assert report.divergence.step == 3 and report.divergence.recorded["scale_after"] == 1.0
    assert report.divergence.expected["scale_after"] == 0.5


def test_divergence_report_shows_both_states_side_by_side():
    report = compare(TorchLikeScaler(growth_interval=3, off_by_one=True), [False] * 6, "torch",
                     growth_interval=3)
    d = report.divergence
    assert (d.step, d.fields) == (2, ("scale_after", "growth_tracker"))
    assert d.recorded["growth_tracker"] == 3 and d.expected["growth_tracker"] == 0
    text = str(report)
    assert text.startswith("DIVERGED at step 2, after 2 agreeing steps")
    assert "131072.0 (0x1.0000000000000p+17)" in text and "<- differs" in text
    assert "growth due (tracker 2+1 reached the interval)" in text
    assert "step 1: found_inf=false" in text           # the agreeing steps before it
    assert [line.split()[0] for line in text.splitlines()[4:11]] == [
        "field", "found_inf", "scale_before", "scale_after", "skipped", "growth_tracker",
        "hysteresis"]


def test_replay_reads_files_uses_header_params_and_overrides(tmp_path):
    from fpsim.conformance import write_trace
    steps, state = [], preset("torch", growth_interval=2, init_scale=8.0).init()
    for i, flag in enumerate([False, False, True, False]):
        after = state.update(flag)
        steps.append(TraceStep(i, flag, state.scale, after.scale, after.skipped,
                               growth_tracker=after.growth_tracker))
        state = after
    path = tmp_path / "t.jsonl"
    write_trace(path, steps, params={"growth_interval": 2, "init_scale": 8.0})
    assert replay(path, "torch").agree
    assert not replay(path, "torch", use_header_params=False).agree
    assert replay(path, "torch", use_header_params=False, growth_interval=2, init_scale=8.0).agree
    report = replay(path, "torch", growth_interval=3)
    assert not report.agree and report.divergence.step == 1
    with pytest.raises(ValueError, match="header params included.*unknown override"):
        replay(Trace(TraceHeader(params={"speed": 1}), ()), "torch")


def test_replay_reports_an_error_the_reference_raises():
    trace = Trace(TraceHeader(), (TraceStep(0, True, 1.0, 1.0, True),
                                  TraceStep(1, True, 1.0, 1.0, True)))
    report = replay(trace, "deepspeed", init_scale=1.0)
    assert not report.agree and report.divergence.step == 1
    assert report.divergence.expected["scale_after"] == "raises"
    assert "LossScaleMinimumError" in report.divergence.reason


def test_compare_stops_where_both_raise():
    class Raises:
        def __init__(self):
            self.inner = ReferenceAdapter("deepspeed", init_scale=4.0)

        scale = property(lambda self: self.inner.scale)

        def update(self, flag):
            return self.inner.update(flag)

    report = compare(Raises(), [True] * 10, "deepspeed", init_scale=4.0)
    assert report.agree and "both stopped at step 3" in report.note

    keeps_going = ReferenceAdapter("deepspeed", init_scale=4.0, raise_at_min=False)
    report = compare(keeps_going, [True] * 10, "deepspeed", init_scale=4.0)
    assert not report.agree and report.steps_compared == 3
    assert report.divergence.step == 3
    assert report.divergence.expected["scale_after"] == "raises"
    assert report.divergence.recorded["scale_after"] == "no error"
    assert "raises LossScaleMinimumError" in str(report)


def test_adapter_protocol_errors():
    with pytest.raises(TypeError, match="update"):
        record(object(), [True])

    class NoScale:
        def update(self, flag):
            return 1.0
    with pytest.raises(AdapterError, match="initial_scale"):
        record(NoScale(), [True])
    assert record(NoScale(), [True], initial_scale=2.0).steps[0].scale_before == 2.0

    class Wrong:
        scale = 1.0

        def update(self, flag):
            return "big"
    with pytest.raises(AdapterError, match="real number"):
        record(Wrong(), [True])

    class Broken:
        scale = 1.0

        def update(self, flag):
            raise ZeroDivisionError("boom")
    with pytest.raises(AdapterError, match="ZeroDivisionError at step 0"):
        record(Broken(), [True])

    class BadState(NoScale):
        scale = 1.0

        def state(self):
            return {"tracker": 1}
    with pytest.raises(AdapterError, match="unknown key"):
        record(BadState(), [True])


def test_reference_arguments_are_checked():
    with pytest.raises(TypeError, match="preset name"):
        replay(Trace(TraceHeader(), ()), 3.0)
    with pytest.raises(ValueError, match="unknown loss-scaling preset"):
        replay(Trace(TraceHeader(), ()), "pytorch")
    state = preset("torch").init()
    with pytest.raises(ValueError, match="ScalerState"):
        replay(Trace(TraceHeader(), ()), state, growth_interval=3)
    scaler = dataclasses.replace(preset("torch"), growth_interval=5)
    with pytest.raises(ValueError, match="no steps: nothing to compare"):
        replay(Trace(TraceHeader(), ()), scaler, growth_interval=3)
    one_step = Trace(TraceHeader(), (TraceStep(0, False, 65536.0, 65536.0, False),))
    assert replay(one_step, scaler, growth_interval=3).agree


# --- hypothesis: the strategies, and docs/conformance.md's few-line property test ----------

@settings(max_examples=60, deadline=None)
@given(overflow_patterns(growth_interval=4))
def test_user_scaler_behaves_like_torch(flags):
    report = compare(TorchLikeScaler(growth_interval=4), flags, "torch", growth_interval=4)
    assert report.agree, report


def test_strategies_find_an_off_by_one_and_a_floor():
    def diverges(scaler_factory):
        return lambda flags: not compare(scaler_factory(), flags, "torch",
                                         growth_interval=4).agree
    found = find(clean_runs(4), diverges(lambda: TorchLikeScaler(4, off_by_one=True)),
                 settings=settings(database=None))
    assert found == [False] * 4 + [True]           # shrunk to one run of exactly the interval
    found = find(collapses("torch", growth_interval=4),
                 diverges(lambda: TorchLikeScaler(4, clamp_min=True)),
                 settings=settings(database=None))
    assert sum(found) >= 137                        # only a collapse reaches 2**-120


def test_strategy_shapes():
    limit = find(growth_to_limit("torch", growth_interval=2), lambda f: True,
                 settings=settings(database=None))
    # 111 growths take 2**16 to 2**127; the 112th falls due at clean step 224 and is refused
    assert limit == [False] * 224 + [True]
    collapse = find(collapses("torch"), lambda f: True, settings=settings(database=None))
    assert collapse == [True] * 166
    burst = find(bursts(), lambda f: sum(f) > 30, settings=settings(database=None))
    assert burst == [True] * 31
    mixed = find(random_flags(50), lambda f: len(f) >= 10 and 0 < sum(f) < len(f),
                 settings=settings(database=None))
    assert len(mixed) == 10
    assert find(random_flags(50), lambda f: len(f) > 3 and all(f),
                settings=settings(database=None)) == [True] * 4
    with pytest.raises(ValueError):
        clean_runs(0)


def test_numpy_patterns_reach_the_ends():
    from fpsim.conformance import collapse, growth_to_limit as limit_pattern, steps_to_collapse
    states = [preset("torch").init()]
    for flag in collapse("torch"):
        states.append(states[-1].update(bool(flag)))
    assert 0.0 in [s.scale for s in states] and states[-1].scale == 0.0
    assert steps_to_collapse("deepspeed") == 17
    state = preset("torch", growth_interval=3).init()
    for flag in limit_pattern("torch", growth_interval=3):
        state = state.update(bool(flag))
        if state.decision.growth_blocked == "nonfinite":
            break
    assert state.scale == 2.0 ** 127
    with pytest.raises(LossScaleMinimumError):
        s = preset("deepspeed").init()
        for _ in range(20):
            s = s.update(True)


def _deepspeed_to_the_floor(path, error_at_the_floor=True, **params):
    """DeepSpeed's scaler (hysteresis 1, floor 1) on overflow after overflow: it raises at the
    floor, which a version-2 trace records as the last step's error."""
    from fpsim.conformance import TraceStep, TraceWriter
    from fpsim.scaling import LossScaleMinimumError
    state = preset("deepspeed", init_scale=8.0, min_scale=1.0, hysteresis=1, **params).init()
    with TraceWriter(path, source="deepspeed-like", params=dict(
            init_scale=8.0, min_scale=1.0, hysteresis=1, **params)) as writer:
        for i in range(10):
            try:
                after = state.update(True)
            except LossScaleMinimumError as err:
                if error_at_the_floor:
                    writer.write(TraceStep(i, True, state.scale, state.scale, True,
                                           error=f"OverflowError: {err}"))
                return
            writer.write(TraceStep(i, True, state.scale, after.scale, after.skipped))
            state = after


def test_an_error_recorded_at_the_floor_agrees_with_a_preset_that_raises_there(tmp_path):
    from fpsim.conformance import read_trace
    path = tmp_path / "floor.jsonl"
    _deepspeed_to_the_floor(path)
    trace = read_trace(path)
    assert json.loads(path.read_text().splitlines()[0])["version"] == 2
    assert trace.steps[-1].error.startswith("OverflowError") and len(trace.steps) == 4
    report = replay(trace, "deepspeed")
    assert report.agree and "error" in report.compared
    # a reference that does not raise there, and a trace that does not record the error
    late = replay(trace, "deepspeed", min_scale=0.5)
    assert not late.agree and late.divergence.fields == ("error",)
    _deepspeed_to_the_floor(tmp_path / "quiet.jsonl", error_at_the_floor=False)
    lines = (tmp_path / "quiet.jsonl").read_text().splitlines()
    lines.append(json.dumps({"step": 3, "found_inf": True, "scale_before": 1.0,
                             "scale_after": 1.0, "skipped": True}))
    (tmp_path / "quiet.jsonl").write_text("\n".join(lines) + "\n")
    silent = replay(read_trace(tmp_path / "quiet.jsonl"), "deepspeed")
    assert not silent.agree and silent.divergence.step == 3
    assert silent.divergence.fields == ("error",) and "raises" in str(silent)


def test_an_error_ends_the_trace_and_version_1_has_no_error_field(tmp_path):
    from fpsim.conformance import TraceFormatError, TraceStep, TraceWriter, read_trace
    path = tmp_path / "floor.jsonl"
    _deepspeed_to_the_floor(path)
    lines = path.read_text().splitlines()
    after = json.dumps({"step": 4, "found_inf": False, "scale_before": 1.0,
                        "scale_after": 1.0, "skipped": False})
    (tmp_path / "more.jsonl").write_text("\n".join(lines + [after]) + "\n")
    with pytest.raises(TraceFormatError, match="recorded an error, which ends the run"):
        read_trace(tmp_path / "more.jsonl")
    header = json.loads(lines[0])
    (tmp_path / "v1.jsonl").write_text("\n".join([json.dumps(dict(header, version=1))]
                                                 + lines[1:]) + "\n")
    with pytest.raises(TraceFormatError, match="unknown step field in version 1"):
        read_trace(tmp_path / "v1.jsonl")
    with TraceWriter(tmp_path / "w.jsonl") as writer:
        writer.write(TraceStep(0, True, 1.0, 1.0, True, error="OverflowError: floor"))
        with pytest.raises(ValueError, match="ends the run"):
            writer.write(TraceStep(1, False, 1.0, 1.0, False))


def test_record_can_end_the_trace_with_the_adapters_error():
    """errors="record": the raise becomes the trace's last step (trace format v2's
    ``error``), which replay compares with the reference's own raise; the adapter's
    ``params`` become the header's."""
    class Floor(ReferenceAdapter):
        params = {"init_scale": 4.0}

    trace = record(Floor("deepspeed", init_scale=4.0), [True] * 10, errors="record")
    assert len(trace.steps) == 4 and trace.header.params == {"init_scale": 4.0}
    assert trace.steps[-1].error.startswith("LossScaleMinimumError")
    assert trace.steps[-1].scale_before == trace.steps[-1].scale_after == 1.0
    assert replay(trace, "deepspeed").agree
    assert not replay(trace, "deepspeed", raise_at_min=False).agree
    with pytest.raises(ValueError, match="errors must be"):
        record(Floor("deepspeed"), [True], errors="ignore")


def test_a_missed_overflow_is_its_own_divergence_even_where_the_scales_agree():
    """found_inf=false with no back-off agrees with any scaler's arithmetic; the step's own
    grad_stats give it away: 18 inf/NaN gradient elements were applied."""
    clean = TraceStep(0, False, 65536.0, 65536.0, False, grad_stats={"count": 40, "nonfinite": 0})
    missed = TraceStep(1, False, 65536.0, 65536.0, False,
                       grad_stats={"count": 40, "nonfinite": 18})
    report = replay(Trace(TraceHeader(source="planted"), (clean, missed)), "torch")
    assert not report.agree and report.steps_compared == 1
    d = report.divergence
    assert (d.kind, d.step, d.fields) == ("missed_overflow", 1, ("found_inf",))
    assert d.expected["scale_after"] == 32768.0 and d.expected["skipped"] is True
    assert str(report).splitlines()[0] == (
        "MISSED OVERFLOW at step 1, after 1 agreeing step: found_inf=false but grad_stats "
        "counts 18 non-finite gradient elements; the step applied them")
    # an overflow the framework did find, and a plain scale mismatch, are not this kind
    found = missed._replace(found_inf=True, scale_after=32768.0, skipped=True)
    assert replay(Trace(TraceHeader(), (clean, found)), "torch").agree
    wrong = replay(Trace(TraceHeader(), (clean, found._replace(scale_after=16384.0))), "torch")
    assert wrong.divergence.kind == "mismatch"
    assert str(wrong).startswith("DIVERGED at step 1")


def test_compare_reports_a_raise_of_the_framework_alone_as_a_divergence():
    class RaisesOnOverflow:
        scale = 65536.0

        def update(self, found_inf):
            if found_inf:
                raise RuntimeError("boom")
            return 65536.0

    report = compare(RaisesOnOverflow(), [False, True, False], "torch")
    assert not report.agree and report.divergence.fields == ("error",)
    assert report.divergence.recorded["error"] == "RuntimeError: boom"
    assert report.divergence.expected["error"] == "no error"
    text = str(report)
    assert "recorded:  RaisesOnOverflow" in text and "reference: preset torch" in text


def test_write_trace_takes_what_record_returns(tmp_path):
    trace = record(ReferenceAdapter("deepspeed", growth_interval=3), [False, True, False])
    write_trace(tmp_path / "t.jsonl", trace)
    back = read_trace(tmp_path / "t.jsonl")
    assert back.steps == trace.steps
    assert back.header.source == "preset deepspeed (growth_interval=3)"
    write_trace(tmp_path / "u.jsonl", trace, source="mine", params={"growth_interval": 3})
    assert read_trace(tmp_path / "u.jsonl").header[:2] == ("mine", {"growth_interval": 3})
