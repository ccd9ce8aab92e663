"""A GGUF file's metadata and tensor directory, parsed directly; tensor data dequantized on demand.

The format (little-endian, versions 2 and 3):

    "GGUF" | version u32 | num_tensors u64 | num_kv u64
    num_kv ×  key (string) | value type u32 | value
    num_tensors ×  name (string) | n_dims u32 | dims u64 × n_dims (innermost first) | ggml type u32 | offset u64
    padding to `general.alignment` (default 32) | tensor data (offsets are relative to here)

A string is a u64 byte length and UTF-8 bytes; an array is an element type u32, a u64 count and
the elements. We parse this ourselves rather than with `gguf.GGUFReader`, which builds a numpy
view per array element and takes seconds on a 49k-token vocabulary; dequantization (runtime/model/gguf_dequant.py)
reads one tensor at a time from a read-only memory map.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from radixflow.runtime.model.gguf_dequant import dequantize

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# fixed-width value types: u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's place in the file: torch-order shape, ggml type id, byte range in the data section."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


class _Cursor:
    """Sequential little-endian reads over a bytes-like buffer."""

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def scalar(self, vtype: int) -> Any:
        fmt = "<" + _SCALAR_FORMATS[vtype]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def count(self) -> int:
        """A u64 element count; each element takes at least one byte, so a count past the buffer's
        end is corruption, caught before a loop or an allocation of that size."""
        count = self.scalar(10)
        if count > len(self.buf) - self.pos:
            raise IndexError(f"a count of {count} at byte {self.pos - 8} runs past the end of the file")
        return count

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        start = self.pos + 8
        self.pos = start + n
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            elem_type, count = self.scalar(4), self.count()
            if elem_type == _STRING:
                return [self.string() for _ in range(count)]
            if elem_type in _SCALAR_FORMATS:
                dtype = np.dtype("<" + _SCALAR_FORMATS[elem_type])
                if self.pos + dtype.itemsize * count > len(self.buf):
                    raise IndexError(f"an array of {count} values at byte {self.pos} runs past the end of the file")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += dtype.itemsize * count
                return arr.tolist()
            return [self.value(elem_type) for _ in range(count)]
        if vtype not in _SCALAR_FORMATS:
            raise ValueError(f"unknown GGUF metadata value type {vtype}")
        return self.scalar(vtype)


class GGUFFile:
    """Metadata (`metadata`: key → Python value) and tensors (`tensors`: name → TensorInfo) of one file.

    The file stays memory-mapped; `dequantize(name)` reads one tensor as fp32 without touching
    the others. Raises ValueError for a file that is not GGUF or is truncated.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # a plain ndarray view of the map: memmap-subclass slices are slow in numpy-heavy dequantizers
        self._data = np.asarray(np.memmap(self.path, dtype=np.uint8, mode="r"))
        buf = memoryview(self._data)
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (magic {bytes(buf[:4])!r})")
        try:
            self._parse(_Cursor(buf, 4))
        except (struct.error, IndexError, OverflowError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.path} is a truncated or corrupt GGUF file: {e}") from e

    def _parse(self, cur: _Cursor) -> None:
        self.version = cur.scalar(4)
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        num_tensors, num_kv = cur.count(), cur.count()
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar(4))
        infos = []
        for _ in range(num_tensors):
            name = cur.string()
            dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
            ggml_type, offset = cur.scalar(4), cur.scalar(10)
            infos.append((name, tuple(reversed(dims)), ggml_type, offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {
            name: TensorInfo(name, shape, ggml_type, offset, tensor_nbytes(shape, ggml_type))
            for name, shape, ggml_type, offset in infos
        }
        for info in self.tensors.values():
            if self.data_start + info.offset + info.nbytes > len(self._data):
                raise ValueError(f"{self.path}: tensor {info.name!r} runs past the end of the file")

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def type_name(self, name: str) -> str:
        return ggml_type_name(self.tensors[name].ggml_type)

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor `name` as uint8 `[*rows, bytes_per_row]` (a view of the map)."""
        info = self.tensors[name]
        start = self.data_start + info.offset
        flat = self._data[start:start + info.nbytes]
        rows = info.shape[:-1] if len(info.shape) > 1 else ()
        return flat.reshape(*rows, -1)

    def dequantize(self, name: str) -> torch.Tensor:
        """Tensor `name` as a fresh fp32 tensor of its torch-order shape.

        ValueError naming the tensor type when it cannot be dequantized.
        """
        import gguf

        info = self.tensors[name]
        try:
            qtype = gguf.GGMLQuantizationType(info.ggml_type)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} has unknown GGML type id {info.ggml_type}") from e
        try:
            return dequantize(self.raw(name), info.ggml_type, info.shape)
        except NotImplementedError as e:
            raise ValueError(f"tensor {name!r} has type {qtype.name}, which cannot be dequantized") from e


def ggml_type_name(ggml_type: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """Bytes a tensor of torch-order `shape` takes when stored as `ggml_type`."""
    import gguf

    try:
        block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as e:
        raise ValueError(f"unsupported GGML tensor type id {ggml_type}") from e
    return math.prod(shape) // block_size * type_size


@lru_cache(maxsize=4)
def open_gguf(path: str, mtime_ns: int) -> GGUFFile:
    """A cached GGUFFile (the tokenizer and the weights both read one); key on mtime to see rewrites."""
    return GGUFFile(path)


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    path = os.path.realpath(os.fspath(path))
    return open_gguf(path, os.stat(path).st_mtime_ns)
