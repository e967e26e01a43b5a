"""Checkpoints keep every bit, survive a failed save, and reject bad files clearly."""
import numpy as np
import pytest

from fpsim.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_bits_dtypes_and_rng_state_round_trip(tmp_path):
    rng = np.random.default_rng(7)
    rng.random(5)
    arrays = {"master": np.float32([1.0, -0.0, np.nan, 2.0 ** -149]),
              "moment": np.arange(6, dtype=np.float64).reshape(2, 3),
              "state/fc1/step_bits": np.uint16([0x7C00, 0x0001])}
    meta = {"step": 12, "scale": 32768.0, "rng": rng.bit_generator.state}
    save_checkpoint(tmp_path / "c.npz", arrays, meta)
    back, back_meta = load_checkpoint(tmp_path / "c.npz")
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes()
    resumed = np.random.default_rng()
    resumed.bit_generator.state = back_meta["rng"]
    assert np.array_equal(resumed.random(4), rng.random(4))
    assert back_meta["step"] == 12 and back_meta["scale"] == 32768.0


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "c.npz"
    save_checkpoint(path, {"w": np.ones(2, np.float32)}, {"step": 1})
    with pytest.raises(TypeError, match="JSON-serialisable"):
        save_checkpoint(path, {"w": np.zeros(2, np.float32)}, {"step": object()})
    arrays, meta = load_checkpoint(path)
    assert meta["step"] == 1 and arrays["w"][0] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]


def test_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="junk.npz is not a readable fpsim checkpoint"):
        load_checkpoint(junk)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, w=np.ones(2))
    with pytest.raises(CheckpointError, match="no fpsim metadata"):
        load_checkpoint(foreign)
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tmp_path / "x.npz", {"__fpsim_meta__": np.ones(1)}, {})
