"""Training traces: exact round trip of every field, flushed per step, clear parse errors."""
import io
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim.train import StepRecord, TraceError, TraceWriter, read_trace


def record(step=0, loss=0.75, **changes):
    base = dict(step=step, loss=loss, scale=65536.0, found_inf=False, skipped=False,
                grad_norm=0.5, underflow_fraction=0.125, lost_update_fraction=0.0,
                wall_time=0.002)
    base.update(changes)
    return StepRecord(**base)


f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


@settings(max_examples=60, deadline=None)
@given(losses=st.lists(f32, min_size=1, max_size=5), layout=st.sampled_from(["jsonl", "csv"]))
def test_round_trip_keeps_bits(tmp_path_factory, losses, layout):
    path = tmp_path_factory.mktemp("t") / f"trace.{layout}"
    written = [record(step=i, loss=float(v), grad_norm=float(v) * 2, found_inf=not math.isfinite(v),
                      skipped=not math.isfinite(v)) for i, v in enumerate(losses)]
    with TraceWriter(path) as writer:
        for rec in written:
            writer.write(rec)
    back = read_trace(path)
    assert len(back) == len(written)
    for a, b in zip(written, back):
        assert np.float32(a.loss).tobytes() == np.float32(b.loss).tobytes() or (
            math.isnan(a.loss) and math.isnan(b.loss))
        assert (a.step, a.found_inf, a.skipped, a.scale) == (b.step, b.found_inf, b.skipped,
                                                             b.scale)


def test_each_step_is_on_disk_before_the_next(tmp_path):
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)
    writer.write(record(0))
    writer.write(record(1))
    assert [r.step for r in read_trace(path)] == [0, 1]  # readable while still open
    writer.close()
    assert json.loads(path.read_text().splitlines()[0])["loss_bits"] == "0x3f400000"


@pytest.mark.parametrize("line,message", [
    ("{not json", "line 2: not JSON"),
    ('{"step": 1}', "line 2: missing field(s) loss"),
    ('[1, 2]', "line 2: expected a JSON object"),
])
def test_malformed_lines_are_named(line, message):
    good = io.StringIO()
    TraceWriter(good).write(record(0))
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace(io.StringIO(good.getvalue() + line + "\n"))


def test_wrong_field_types_are_named():
    row = record(3).as_row()
    for field, bad, expected in [("step", "three", "'step' must be an integer"),
                                 ("skipped", "maybe", "'skipped' must be true or false"),
                                 ("scale", "big", "'scale' must be a number"),
                                 ("loss_bits", "0x3f000000", "does not match loss")]:
        broken = dict(row, **{field: bad})
        with pytest.raises(TraceError, match=f"line 1: .*{expected}"):
            read_trace(io.StringIO(json.dumps(broken) + "\n"))


def test_unknown_layout():
    with pytest.raises(ValueError, match="'jsonl' or 'csv'"):
        TraceWriter(io.StringIO(), layout="xml")
