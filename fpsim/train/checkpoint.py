"""Checkpoints: named arrays plus JSON metadata in one ``.npz`` file, written atomically.

Arrays keep their dtype and bits (float32 master weights, fp16 working copies in float32
containers, optimizer moments); metadata holds scalars, the scaler state, the step and the
``numpy.random.Generator`` state (``bit_generator.state`` is plain JSON). A crash while saving
leaves the previous checkpoint intact: the file is written beside the target and renamed.

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.npz")
>>> save_checkpoint(path, {"w": np.float32([1.5, -0.0])}, {"step": 3})
>>> arrays, meta = load_checkpoint(path)
>>> arrays["w"].tobytes() == np.float32([1.5, -0.0]).tobytes(), meta["step"]
(True, 3)
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from ..files import atomic_file

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_VERSION"]

CHECKPOINT_VERSION = 1
_META_KEY = "__fpsim_meta__"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read back: says which file and what is wrong."""


def save_checkpoint(path: "str | os.PathLike", arrays: dict[str, np.ndarray], meta: dict) -> None:
    path = Path(path)
    if _META_KEY in arrays:
        raise ValueError(f"{_META_KEY!r} is reserved for the metadata; rename that array")
    try:
        meta_text = json.dumps({"version": CHECKPOINT_VERSION, **meta}, sort_keys=True,
                               allow_nan=True)
    except TypeError as err:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {err}") from None
    payload = {name: np.asarray(value) for name, value in arrays.items()}
    payload[_META_KEY] = np.frombuffer(meta_text.encode("utf-8"), dtype=np.uint8)
    with atomic_file(path, "wb") as handle:
        np.savez(handle, **payload)


def load_checkpoint(path: "str | os.PathLike") -> tuple[dict[str, np.ndarray], dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise CheckpointError(f"{path} is not a readable fpsim checkpoint ({err})") from None
    raw_meta = arrays.pop(_META_KEY, None)
    if raw_meta is None:
        raise CheckpointError(f"{path} has no fpsim metadata; was it written by save_checkpoint?")
    try:
        meta = json.loads(raw_meta.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: metadata is not valid JSON ({err})") from None
    version = meta.pop("version", None)
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {version!r}; this fpsim reads "
                              f"version {CHECKPOINT_VERSION}")
    return arrays, meta
