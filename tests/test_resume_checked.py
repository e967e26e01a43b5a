"""Resume is exact or refused: a different configuration is named, a checkpoint is checked
completely (sizes before anything is read) before any file is written, and a trace that
cannot continue cleanly is refused or trimmed with a note, never left with a gap."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from fpsim import nn, use_policy
from fpsim.cli import main
from fpsim.optim import SGD, Adam, Optimizer
from fpsim.train import (CheckpointError, TraceError, load_checkpoint, make_dataset, read_trace,
                         save_checkpoint, train)

SMALL = ["train", "--samples", "128", "--features", "4", "--hidden", "8", "--batch-size", "8",
         "--quiet"]


def run(out, steps, resume=None, lr=0.1, rule=None, master="fp32", hidden=8, samples=128,
        batch_size=8, **kwargs):
    kwargs.setdefault("scaler", None)       # not the recipe's: a scaler that never skips
    data = make_dataset("blobs", n=samples, features=4, classes=3, seed=0)
    with use_policy("16-mixed"):
        model = nn.MLP([4, hidden, 3], rng=0)
        optimizer = Optimizer(model, rule or SGD(lr=lr, momentum=0.9), master=master)
    return train(model, data, optimizer=optimizer, steps=steps, batch_size=batch_size, seed=2,
                 out=out, resume=resume, progress=False, **kwargs)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def no_time(records):
    return [r._replace(wall_time=0.0) for r in records]


def test_a_different_configuration_is_refused_with_the_fields_named(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, "--steps", "4", "--out", str(out)]) == 0
    before = snapshot(out)
    resume = ["--out", str(out), "--resume", str(out / "checkpoint.npz"), "--steps", "6"]
    assert main([*SMALL, *resume, "--lr", "0.2", "--seed", "1", "--policy", "bf16-mixed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fpsim: error: cannot resume")
    assert "differs in data_sha256, lr, policy, scaler, seed (" in err
    assert "--allow-change lr" in err
    assert snapshot(out) == before                   # run.json, trace, checkpoint untouched
    assert main([*SMALL, *resume, "--lr", "0.2"]) == 2
    assert main([*SMALL, *resume, "--lr", "0.2", "--allow-change", "lr"]) == 0
    assert len(read_trace(out / "trace.jsonl")) == 6


@pytest.mark.parametrize("change,fields", [
    (dict(scaler="static:1024"), "scaler"),
    (dict(batch_size=16), "batch_size"),
    (dict(master=None), "master"),
    (dict(rule=Adam(lr=0.1)), "beta1, beta2, dampening, decoupled, eps, momentum, nesterov, "
                              "optimizer"),
    (dict(hidden=9), "parameters"),
    (dict(samples=64), "data_sha256"),
    (dict(policy="bf16-mixed"), "policy"),
])
def test_each_setting_is_compared(tmp_path, change, fields):
    run(tmp_path, 4)
    with pytest.raises(ValueError, match=f"the configuration differs in {fields} \\("):
        run(tmp_path, 6, resume=tmp_path / "checkpoint.npz", **change)


def test_a_checkpoint_cannot_continue_another_runs_trace(tmp_path):
    run(tmp_path / "a", 4)
    run(tmp_path / "b", 6, hidden=9)
    before = snapshot(tmp_path / "b")
    with pytest.raises(ValueError, match="b/run.json \\(the run whose trace would continue\\): "
                                         "the configuration differs in parameters"):
        run(tmp_path / "b", 8, resume=tmp_path / "a" / "checkpoint.npz")
    assert snapshot(tmp_path / "b") == before


def test_a_trace_with_later_steps_and_a_torn_line_is_trimmed_with_a_note(tmp_path):
    whole = run(tmp_path / "whole", 6)
    out = tmp_path / "run"
    run(out, 4)
    lines = (tmp_path / "whole" / "trace.jsonl").read_text().splitlines(keepends=True)
    (out / "trace.jsonl").write_text("".join(lines) + lines[0][:25])   # ran on, then torn
    with pytest.raises(TraceError, match="line 7: torn"):
        read_trace(out / "trace.jsonl")
    resumed = run(out, 6, resume=out / "checkpoint.npz")
    assert resumed.notes == [f"{out / 'trace.jsonl'}: dropped 2 step(s) after step 3 and a last "
                             f"line torn by an interruption; the trace continues from the "
                             f"checkpoint's step 4"]
    assert no_time(read_trace(out / "trace.jsonl")) == no_time(whole.records)
    assert resumed.loss_hash == whole.loss_hash


@pytest.mark.parametrize("keep", [2, None])
def test_a_trace_short_of_the_checkpoint_is_refused(tmp_path, keep):
    out = tmp_path / "run"
    run(out, 4)
    trace = out / "trace.jsonl"
    if keep is None:
        trace.unlink()
    else:
        lines = trace.read_text().splitlines(keepends=True)
        trace.write_text("".join(lines[:keep]) + lines[keep][:10])   # torn before the step
    before = snapshot(out)
    with pytest.raises(ValueError, match="cannot resume at step 4: .*(ends at step 1, so steps "
                                         "2..3 are missing|there is no)"):
        run(out, 6, resume=out / "checkpoint.npz")
    assert snapshot(out) == before


def crafted(tmp_path, change):
    """A good checkpoint, its arrays and metadata passed through ``change``, saved again."""
    run(tmp_path / "good", 4)
    arrays, meta = load_checkpoint(tmp_path / "good" / "checkpoint.npz")
    change(arrays, meta)
    path = tmp_path / "crafted.npz"
    save_checkpoint(path, arrays, meta)
    return path


def _set(mapping, key, value):
    mapping[key] = value


@pytest.mark.parametrize("change,message", [
    (lambda a, m: _set(m, "step", -1), "step must be a non-negative integer"),
    (lambda a, m: _set(m, "step", 2.5), "step must be a non-negative integer"),
    (lambda a, m: _set(m, "extra", 1), "unknown keys \\['extra'\\]"),
    (lambda a, m: m.pop("config"), "lacks \\['config'\\]"),
    (lambda a, m: _set(m["scaler"], "scale", float("inf")), "scale must be a finite number"),
    (lambda a, m: _set(m["scaler"], "scale", -2.0), "scale must be a finite number"),
    (lambda a, m: _set(m["scaler"], "growths", True), "growths must be an integer"),
    (lambda a, m: _set(m, "rng", {"bit_generator": "PCG64"}), "generator's state"),
    (lambda a, m: _set(a, "extra/x", np.zeros(2)), "unknown arrays"),
    (lambda a, m: _set(a, "param/0.weight", np.zeros((8, 4), np.int32)), "'0.weight' is int32"),
    (lambda a, m: _set(a, "param/0.bias", np.zeros(9, np.float32)), "'0.bias' is float32\\[9\\]"),
    (lambda a, m: a.pop("optim/master/0.bias"), "lacks \\['master/0.bias'\\]"),
    (lambda a, m: _set(a, "optim/step_count", np.int64(-3)), "step_count must be >= 0"),
])
def test_every_part_of_a_checkpoint_is_checked_before_anything_changes(tmp_path, change,
                                                                      message):
    path = crafted(tmp_path, change)
    out = tmp_path / "good"
    before = snapshot(out)
    with pytest.raises(ValueError, match=message):
        run(out, 6, resume=path)
    assert snapshot(out) == before


def zip_with(members: dict[str, bytes], compress=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compress) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def npy_header(descr: str, shape) -> bytes:
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * (63 - len(text) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")


@pytest.mark.parametrize("members,compress,message", [
    # a header claiming 4 GB behind 16 bytes: refused before the array is allocated
    ({"param/w.npy": npy_header("<f4", (10**9,)) + bytes(16)}, zipfile.ZIP_STORED,
     "header says float32\\[1000000000\\] but it holds 16 bytes"),
    # 8 MiB of zeros deflated to a few kB: refused from the zip directory, before inflating
    ({"param/w.npy": npy_header("<f4", (2**21,)) + bytes(2**23)}, zipfile.ZIP_DEFLATED,
     "would expand to 83886.. bytes, more than 32 times"),
    ({"param/w.npy": npy_header("|O", (2,)) + bytes(16)}, zipfile.ZIP_STORED,
     "not a plain number type"),
    ({"param/w.npy": npy_header("<f4", (-1,))}, zipfile.ZIP_STORED, "non-negative integers"),
    ({"param/w.npy": b"\x93NUMPY\x01\x00" + (60000).to_bytes(2, "little")}, zipfile.ZIP_STORED,
     "header is 60000 bytes long"),
    ({"notes.txt": b"hi"}, zipfile.ZIP_STORED, "holds only .npy arrays"),
])
def test_crafted_archives_are_refused_before_their_data_is_read(tmp_path, members, compress,
                                                                message):
    path = tmp_path / "crafted.npz"
    path.write_bytes(zip_with(members, compress))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_crafted_checkpoint_from_the_cli_is_one_line(tmp_path, capsys):
    path = tmp_path / "crafted.npz"
    path.write_bytes(zip_with({"param/w.npy": npy_header("<f4", (10**9,)) + bytes(16)}))
    assert main([*SMALL, "--steps", "4", "--resume", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fpsim: error: ") and err.count("\n") == 1 and "header says" in err


@pytest.mark.parametrize("edit,message", [
    (lambda arrays, meta: arrays.update({"optim/step_count": np.int64(5)}),
     "the optimizer has taken 5 steps, but step 6 with 0 skipped means 6"),
    (lambda arrays, meta: meta["scaler"].update(step=7),
     "the scaler has seen 7 steps but the checkpoint is at step 6"),
])
def test_a_checkpoint_whose_step_counts_disagree_is_refused(tmp_path, edit, message):
    run(tmp_path / "a", 6)
    arrays, meta = load_checkpoint(tmp_path / "a" / "checkpoint.npz")
    edit(arrays, meta)
    save_checkpoint(tmp_path / "edited.npz", arrays, meta)
    with pytest.raises(CheckpointError, match=message):
        run(tmp_path / "b", 9, resume=tmp_path / "edited.npz")
    assert not (tmp_path / "b").exists()
