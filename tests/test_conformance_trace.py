"""The scaler trace format: round trips, and the reader naming the exact line and field."""
import io
import json
import math

import pytest

from fpsim.conformance import (TRACE_FORMAT, TRACE_VERSION, TraceFormatError, TraceStep,
                               TraceWriter, read_trace, write_trace)

HEADER = json.dumps({"format": TRACE_FORMAT, "version": TRACE_VERSION, "source": "test"})
GOOD = {"step": 0, "found_inf": False, "scale_before": 65536.0, "scale_after": 65536.0,
        "skipped": False}


def text_of(*rows, header=HEADER):
    lines = [header] + [r if isinstance(r, str) else json.dumps(r) for r in rows]
    return "\n".join(lines) + "\n"


def test_round_trip_keeps_every_value_exactly(tmp_path):
    scales = [2.0 ** 127, 2.0 ** -149, 0.0, math.inf, float.fromhex("0x1.fffffep+127"),
              1000.0999755859375, 5e-324]
    steps = []
    for i, (a, b) in enumerate(zip(scales, scales[1:] + [math.nan])):
        steps.append(TraceStep(i, i % 2 == 0, a, b, i % 2 == 0, growth_tracker=i,
                               hysteresis=1 - i,
                               grad_stats={"count": 10, "max_abs": 3.4e38, "l2_norm": math.inf}))
    path = tmp_path / "t.jsonl"
    write_trace(path, steps, source="unit", params={"growth_interval": 7, "init_scale": 0.5,
                                                    "precision": "float32", "min_scale": None})
    trace = read_trace(path)
    assert trace.header.source == "unit"
    assert trace.header.params == {"growth_interval": 7, "init_scale": 0.5,
                                   "precision": "float32", "min_scale": None}
    for ours, back in zip(steps, trace.steps):
        assert back.found_inf == ours.found_inf and back.skipped == ours.skipped
        assert back.scale_before.hex() == ours.scale_before.hex()
        assert (math.isnan(back.scale_after) and math.isnan(ours.scale_after)
                or back.scale_after.hex() == ours.scale_after.hex())
        assert back.growth_tracker == ours.growth_tracker and back.hysteresis == ours.hysteresis
        assert back.grad_stats["l2_norm"] == math.inf
    assert trace.lines == tuple(range(2, 2 + len(steps)))


def test_writer_flushes_each_line_and_keeps_order():
    out = io.StringIO()
    writer = TraceWriter(out, source="s")
    writer.write(TraceStep(0, True, 4.0, 2.0, True))
    assert out.getvalue().count("\n") == 2             # header + step, already written
    with pytest.raises(ValueError, match="expected step 1, got 3"):
        writer.write(TraceStep(3, True, 2.0, 1.0, True))
    with pytest.raises(TypeError, match="TraceStep"):
        writer.write({"step": 1})


def test_blank_lines_are_ignored_and_hex_floats_accepted():
    row = dict(GOOD, scale_before="0x1p+16", scale_after="0x1p+16")
    trace = read_trace(io.StringIO(HEADER + "\n\n" + json.dumps(row) + "\n\n"))
    assert trace.steps[0].scale_before == 65536.0 and trace.lines == (3,)


BAD = [
    # (rows after the header, expected line, expected field, words in the message)
    ([dict(GOOD, found_inf="yes")], 2, "found_inf", "true or false"),
    ([dict(GOOD, skipped=1)], 2, "skipped", "true or false"),
    ([dict(GOOD, scale_after="big")], 2, "scale_after", "must be a number"),
    ([dict(GOOD, scale_before=True)], 2, "scale_before", "must be a number"),
    ([{k: v for k, v in GOOD.items() if k != "skipped"}], 2, "skipped", "missing"),
    ([dict(GOOD, found_Inf=True)], 2, "found_Inf", "unknown step field"),
    ([dict(GOOD, step=1)], 2, "step", "expected 0"),
    ([GOOD, dict(GOOD, step=2)], 3, "step", "expected 1"),
    ([GOOD, dict(GOOD, step=1, scale_before=2.0)], 3, "scale_before", "previous step"),
    ([dict(GOOD, step=0.0)], 2, "step", "integer"),
    ([dict(GOOD, growth_tracker="3")], 2, "growth_tracker", "integer"),
    ([dict(GOOD, grad_stats=[1, 2])], 2, "grad_stats", "object"),
    ([dict(GOOD, grad_stats={"norm": "x"})], 2, "grad_stats.norm", "must be a number"),
    ([dict(GOOD, grad_stats={"nonfinite": 1.5})], 2, "grad_stats.nonfinite", "whole number"),
    ([dict(GOOD, grad_stats={"nonfinite": -1})], 2, "grad_stats.nonfinite", "whole number"),
    ([dict(GOOD, grad_stats={"count": 2, "nonfinite": 3})], 2, "grad_stats.nonfinite",
     "more than count 2.0"),
    ([GOOD, "{not json"], 3, None, "not valid JSON"),
    ([GOOD, "[1, 2]"], 3, None, "JSON object"),
]


@pytest.mark.parametrize("rows,line,field,words", BAD)
def test_reader_names_line_and_field(rows, line, field, words):
    with pytest.raises(TraceFormatError, match=words) as info:
        read_trace(io.StringIO(text_of(*rows)))
    assert info.value.line == line and info.value.field == field
    assert f"line {line}" in str(info.value)
    if field:
        assert repr(field) in str(info.value)


@pytest.mark.parametrize("header,field,words", [
    (json.dumps({"format": "other", "version": 1}), "format", "fpsim-scaler-trace"),
    (json.dumps({"format": TRACE_FORMAT, "version": 3}), "version", "knows versions 1, 2"),
    (json.dumps({"format": TRACE_FORMAT, "version": True}), "version", "knows versions 1, 2"),
    (json.dumps({"format": TRACE_FORMAT, "version": 1, "sauce": "x"}), "sauce", "unknown"),
    (json.dumps({"format": TRACE_FORMAT, "version": 1, "params": [1]}), "params", "object"),
    (json.dumps({"format": TRACE_FORMAT, "version": 1, "params": {"init_scale": "big"}}),
     "params.init_scale", "number"),
    (json.dumps({"format": TRACE_FORMAT, "version": 1, "source": 3}), "source", "string"),
    (json.dumps(GOOD), "format", "missing header"),
])
def test_reader_checks_the_header(header, field, words):
    with pytest.raises(TraceFormatError, match=words) as info:
        read_trace(io.StringIO(text_of(header=header)))
    assert info.value.line == 1 and info.value.field == field


def test_empty_missing_and_binary_files(tmp_path):
    with pytest.raises(TraceFormatError, match="empty trace"):
        read_trace(io.StringIO("\n\n"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_trace(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceFormatError, match="UTF-8"):
        read_trace(bad)
    assert issubclass(TraceFormatError, ValueError)


def test_writer_rejects_bad_params_and_source():
    with pytest.raises(TypeError, match="params"):
        TraceWriter(io.StringIO(), params={"init_scale": [1.0]})
    with pytest.raises(TypeError, match="source"):
        TraceWriter(io.StringIO(), source=3)
