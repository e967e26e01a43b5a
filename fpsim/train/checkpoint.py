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

import ast
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np

from ..files import atomic_file

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_VERSION",
           "read_npy_header", "load_npy", "check_step_counts"]

CHECKPOINT_VERSION = 2      # 2: the metadata holds the run's configuration
_META_KEY = "__fpsim_meta__"
# A checkpoint's arrays are stored, not compressed (np.savez); a compressed member may
# expand at most this much, so a small crafted file cannot make loading allocate gigabytes.
MAX_EXPANSION = 32
_MAX_HEADER = 10_000        # NumPy's own limit on an .npy header's length


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
    """The arrays and metadata of a checkpoint. Before any array is read, the archive's
    directory and every ``.npy`` header are checked: member names, plain numeric dtypes, and
    sizes (each member must hold exactly the bytes its header's shape needs, and all of them
    at most ``MAX_EXPANSION`` times the file's size), so nothing large is allocated for a
    crafted file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        _check_archive(path)
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except CheckpointError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise CheckpointError(f"{path} is not a readable fpsim checkpoint ({err})") from None
    raw_meta = arrays.pop(_META_KEY, None)
    if raw_meta is None:
        raise CheckpointError(f"{path} has no fpsim metadata; was it written by save_checkpoint?")
    try:
        meta = json.loads(raw_meta.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path}: metadata is not valid JSON ({str(err)[:100]})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: metadata must be a JSON object")
    version = meta.pop("version", None)
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {version!r}; this fpsim reads "
                              f"version {CHECKPOINT_VERSION}")
    return arrays, meta


def _check_archive(path: Path) -> None:
    limit = MAX_EXPANSION * max(path.stat().st_size, 1 << 16)
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        declared = sum(m.file_size for m in members)
        if declared > limit:
            raise CheckpointError(f"{path}: its members would expand to {declared} bytes, more "
                                  f"than {MAX_EXPANSION} times the file's size; not a checkpoint "
                                  f"fpsim wrote")
        names = [m.filename for m in members]
        if len(set(names)) != len(names):
            raise CheckpointError(f"{path}: an array name appears twice")
        for member in members:
            where = f"{path}: array {member.filename!r}"
            if not member.filename.endswith(".npy"):
                raise CheckpointError(f"{where}: a checkpoint holds only .npy arrays")
            with archive.open(member) as stream:
                try:
                    descr, _, shape, offset = read_npy_header(stream, where)
                except ValueError as err:
                    raise CheckpointError(str(err)) from None
            dtype = _plain_dtype(descr, where)
            if offset + math.prod(shape) * dtype.itemsize != member.file_size:
                raise CheckpointError(f"{where}: its header says {dtype}{list(shape)} but it "
                                      f"holds {member.file_size - offset} bytes of data")


def _plain_dtype(descr, where: str) -> np.dtype:
    try:
        dtype = np.lib.format.descr_to_dtype(descr)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: dtype {descr!r} is not one NumPy reads ({err})") \
            from None
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None:
        raise CheckpointError(f"{where}: dtype {dtype} is not a plain number type (bool, int, "
                              f"uint or float)")
    return dtype


def read_npy_header(stream, where: str) -> tuple[object, bool, tuple[int, ...], int]:
    """Read an ``.npy`` header from a binary stream without loading data or building the
    dtype: returns (descr as written, fortran_order, shape, offset of the data). A header
    that is malformed, longer than NumPy allows, or has a negative or non-integer shape
    raises ``ValueError`` naming ``where``."""
    magic = stream.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        raise ValueError(f"{where}: no NUMPY magic at its start")
    major = magic[6]
    if major not in (1, 2, 3):
        raise ValueError(f"{where}: .npy format version {major}.{magic[7]} is not known "
                         f"(1, 2 and 3 are)")
    size_bytes = stream.read(2 if major == 1 else 4)
    length = int.from_bytes(size_bytes, "little")
    if len(size_bytes) < (2 if major == 1 else 4) or length > _MAX_HEADER:
        raise ValueError(f"{where}: the .npy header is {length} bytes long; at most "
                         f"{_MAX_HEADER} are read")
    raw = stream.read(length)
    if len(raw) < length:
        raise ValueError(f"{where}: the .npy header is cut short")
    try:
        header = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, RecursionError, MemoryError,
            TypeError) as err:
        raise ValueError(f"{where}: the .npy header is not a Python literal "
                         f"({type(err).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"{where}: the .npy header must be a dict of descr, fortran_order "
                         f"and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"{where}: the .npy shape must be a tuple of non-negative integers, "
                         f"got {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"{where}: the .npy fortran_order must be True or False")
    return header["descr"], fortran, shape, 8 + len(size_bytes) + length


def load_npy(path: "str | os.PathLike", what: str, *, raw_float8: bool = False) -> np.ndarray:
    """One ``.npy`` array, checked before its data is read: the header (``read_npy_header``),
    a plain dtype (no Python objects), and a file size that matches the shape exactly, so a
    crafted header cannot make this allocate more than the file holds. Non-native byte order
    is converted (the values are unchanged). ``raw_float8``: a descriptor ``<f1`` (what
    ``np.save`` writes for ml_dtypes' ``float8_e5m2``, and NumPy cannot read back) is read as
    raw one-byte items (``|V1``). Errors name ``what`` and the file."""
    path = Path(path)
    where = f"{what} file {str(path)!r} is not a readable .npy array"
    try:
        size = path.stat().st_size
        with open(path, "rb") as stream:
            descr, fortran, shape, offset = read_npy_header(stream, where)
            if raw_float8 and isinstance(descr, str) and descr in ("<f1", "|f1", ">f1", "=f1"):
                dtype = np.dtype("V1")
            else:
                try:
                    dtype = np.lib.format.descr_to_dtype(descr)
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{where}: dtype {descr!r} is not one NumPy reads "
                                     f"({err})") from None
            if dtype.hasobject:
                raise ValueError(f"{where}: holds Python objects; only plain arrays are read")
            count = math.prod(shape)
            if offset + count * dtype.itemsize != size:
                raise ValueError(f"{where}: its header says {count} items of {dtype} "
                                 f"({count * dtype.itemsize} bytes) but the file holds "
                                 f"{size - offset} bytes of data")
            data = stream.read(count * dtype.itemsize)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} file {str(path)!r} is a folder; give an .npy file") from None
    except PermissionError:
        raise ValueError(f"{what} file {str(path)!r} cannot be read (permission denied)") \
            from None
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C").copy()
    if dtype.kind in "biufc" and not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array


def check_step_counts(where: str, step: int, scaler_step: int, skipped: int, step_count) -> None:
    """A training checkpoint's three step counts agree: the scaler saw every training step,
    and the optimizer took each one the scaler did not skip (a mismatch is a checkpoint
    edited or put together from two runs; resumed, it would run Adam's bias correction off).
    ``step_count`` that is not a non-negative integer count is left to the optimizer's own
    check, which names it."""
    if scaler_step != step:
        raise CheckpointError(f"{where}: the scaler has seen {scaler_step} steps but the "
                              f"checkpoint is at step {step}; they must agree")
    count = np.asarray(step_count) if step_count is not None else None
    if count is None or count.shape != () or count.dtype.kind not in "iu" or int(count) < 0:
        return
    if int(count) != step - skipped:
        raise CheckpointError(f"{where}: the optimizer has taken {int(count)} steps, but step "
                              f"{step} with {skipped} skipped means {step - skipped}; they "
                              f"must agree")
