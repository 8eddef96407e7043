"""Reading a GGUF file's container: its metadata, its tensor table, and one tensor's raw bytes at a time.

We parse the header ourselves instead of with gguf.GGUFReader: the reader builds a numpy view for every
part of every value, which for a vocabulary of ~50k tokens and merges takes 5-10 s; walking the same
bytes with struct takes a fraction of a second. The gguf package still provides the type tables and
the dequantization (gguf_weights.py).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from services.worker.models.errors import CheckpointError

if TYPE_CHECKING:
    from gguf.constants import GGMLQuantizationType

GGUF_SUFFIX = ".gguf"
_MAGIC = b"GGUF"
_VERSIONS = (2, 3)  # v1 counted with 32-bit integers and is long gone from the wild
_DEFAULT_ALIGNMENT = 32  # llama.cpp's, when general.alignment is absent
_MAX_DIMS = 4  # GGML_MAX_DIMS
# GGUF metadata value type ids -> struct formats of the fixed-size ones (8 is a string, 9 an array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table. shape is in torch order ([out, in] for a weight), the reverse of
    GGUF's; offset is absolute in the file, nbytes what the stored (maybe quantized) data occupies."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF header: metadata values as Python objects (arrays as lists), tensors by name."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    @property
    def architecture(self) -> str:
        """general.architecture, e.g. 'llama'."""
        return str(self.metadata.get("general.architecture", ""))


def is_gguf_path(path: str | Path) -> bool:
    """True if path names a GGUF file: a .gguf suffix (whether or not it exists), or an existing file
    that starts with the GGUF magic bytes. A directory never is."""
    path = Path(path)
    if path.is_dir():
        return False
    if path.suffix.lower() == GGUF_SUFFIX:
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse path's header and tensor table (no tensor data is read). CheckpointError naming the file if it
    is missing, not GGUF, an unsupported version, truncated (header or any tensor's data), or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found" if not path.exists() else "not a file")
    with path.open("rb") as f:
        reader = _Reader(f, path, os.fstat(f.fileno()).st_size)
        if reader.size < 4 or reader.take(4) != _MAGIC:
            raise CheckpointError(path, "not a GGUF file (it does not start with the GGUF magic bytes)")
        version = reader.scalar("I")
        if version not in _VERSIONS:
            raise CheckpointError(path, f"unsupported GGUF version {version}; supported: 2, 3")
        tensor_count, kv_count = reader.scalar("Q"), reader.scalar("Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = reader.string()
            if key in metadata:
                raise CheckpointError(path, f"metadata key {key!r} appears twice")
            metadata[key] = reader.value(reader.scalar("I"), key)
        table = [_tensor_entry(reader) for _ in range(tensor_count)]
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise CheckpointError(path, f"general.alignment must be a power of two, got {alignment!r}")
        data_start = -(-reader.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, type_id, offset in table:
        if name in tensors:
            raise CheckpointError(path, f"tensor {name!r} appears twice in the tensor table")
        tensor = _tensor(path, name, dims, type_id, data_start + offset)
        if tensor.offset + tensor.nbytes > reader.size:
            problem = f"truncated: tensor {name!r} ends at byte {tensor.offset + tensor.nbytes}"
            raise CheckpointError(path, f"{problem}, the file has {reader.size}")
        tensors[name] = tensor
    return GGUFFile(path, metadata, tensors)


def read_tensor_bytes(f: BinaryIO, path: Path, tensor: GGUFTensor) -> np.ndarray:
    """tensor's stored bytes from the open file f, as a writable uint8 array of tensor.nbytes (read into
    memory rather than mapped, so nothing outlives the file's closing). CheckpointError if short."""
    buf = np.empty(tensor.nbytes, dtype=np.uint8)
    f.seek(tensor.offset)
    if f.readinto(memoryview(buf)) != tensor.nbytes:
        raise CheckpointError(path, f"truncated: cannot read tensor {tensor.name!r}")
    return buf


class _Reader:
    """Sequential little-endian reads from a file, every length checked against what is left, so a
    truncated or corrupt header fails with CheckpointError instead of a huge allocation or garbage."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self._f, self.path, self.size, self.pos = f, path, size, 0

    def take(self, n: int) -> bytes:
        if n > self.size - self.pos:
            problem = f"truncated or corrupt GGUF header (needs {n} bytes at byte {self.pos})"
            raise CheckpointError(self.path, problem)
        data = self._f.read(n)
        self.pos += n
        return data

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]
        # A float32 1e-5 widens to 9.999999747e-06; its shortest float32 spelling is the value meant.
        return float(str(np.float32(value))) if fmt == "f" else value

    def string(self) -> str:
        raw = self.take(self.scalar("Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CheckpointError(self.path, f"corrupt GGUF header: a string is not UTF-8 ({err})") from err

    def value(self, type_id: int, key: str) -> Any:
        if type_id in _SCALARS:
            return self.scalar(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id != _ARRAY:
            raise CheckpointError(self.path, f"metadata key {key!r} has unknown value type {type_id}")
        item_type, count = self.scalar("I"), self.scalar("Q")
        if item_type in _SCALARS:
            # One unpack for the whole array: token_type arrays have one entry per vocabulary token.
            fmt = f"<{count}{_SCALARS[item_type]}"
            return list(struct.unpack(fmt, self.take(struct.calcsize(fmt))))
        if count * 8 > self.size - self.pos:  # every element needs at least its 8-byte length
            raise CheckpointError(self.path, f"truncated or corrupt GGUF header (array {key!r} of {count})")
        return [self.value(item_type, key) for _ in range(count)]


def _tensor_entry(reader: _Reader) -> tuple[str, tuple[int, ...], int, int]:
    """(name, GGUF-order dims, ggml type id, offset from the data section) of the next table entry."""
    name = reader.string()
    n_dims = reader.scalar("I")
    if n_dims > _MAX_DIMS:
        raise CheckpointError(reader.path, f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
    dims = tuple(reader.scalar("Q") for _ in range(n_dims))
    return name, dims, reader.scalar("I"), reader.scalar("Q")


def _tensor(path: Path, name: str, dims: tuple[int, ...], type_id: int, offset: int) -> GGUFTensor:
    # Imported here: the gguf package takes ~0.3 s to import, and config.py imports this module for
    # is_gguf_path on every load, GGUF or not.
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise CheckpointError(path, f"tensor {name!r} has unknown ggml type id {type_id}") from None
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    # GGUF lists the fastest-moving dimension first, which is the row a quantization block runs along.
    if dims and dims[0] % block_size:
        problem = f"tensor {name!r} rows of {dims[0]} are not a multiple of {ggml_type.name}'s block"
        raise CheckpointError(path, f"{problem} of {block_size}")
    nbytes = math.prod(dims) // block_size * type_size
    return GGUFTensor(name, ggml_type, tuple(reversed(dims)), offset, nbytes)
