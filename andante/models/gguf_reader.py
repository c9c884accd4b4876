"""A lean GGUF parser: metadata as Python values, tensors as memory-mapped bytes.

Design note. `gguf.GGUFReader` builds numpy views for every element of every metadata
array, which takes 2-10 s for a 49k-token vocabulary on this machine; this parser reads
the same format (GGUF v2/v3: header, typed key/value pairs, tensor infos, aligned data;
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) with `struct` in ~0.1 s.
Dequantization is left to the `gguf` package.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type id -> struct format of a scalar (8: string, 9: array handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
            11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first)
    ggml_type: int
    offset: int  # from the start of the data section


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def strings(self, count: int) -> list[str]:
        buf, pos, unpack = self.buf, self.pos, struct.Struct("<Q").unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            n = unpack(buf, pos)[0]
            pos += 8
            append(str(buf[pos:pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype == _STRING:
                return self.strings(count)
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                items = struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos)
                self.pos += size * count
                return list(items)
            return [self.value(etype) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.scalar(_SCALARS[vtype])


class GGUFFile:
    """Metadata (`fields`) and tensors of one GGUF file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._data: np.memmap | None = None
        self._data_start = 0

    def read(self) -> GGUFFile:
        """Parse the header; raises ValueError naming the file if it is not GGUF."""
        try:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read GGUF file {self.path}: {exc}") from exc
        try:
            self._parse(memoryview(self._data))  # type: ignore[arg-type]
        except (struct.error, UnicodeDecodeError, IndexError, OverflowError) as exc:
            raise ValueError(f"{self.path} is not a valid GGUF file ({exc})") from exc
        return self

    def _parse(self, buf: memoryview) -> None:
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (bad magic)")
        cur = _Cursor(buf)
        cur.pos = 4
        version = cur.scalar("I")
        if version not in (2, 3):
            raise ValueError(f"{self.path}: unsupported GGUF version {version}")
        num_tensors, num_fields = cur.scalar("Q"), cur.scalar("Q")
        for _ in range(num_fields):
            key = cur.string()
            self.fields[key] = cur.value(cur.scalar("I"))
        for _ in range(num_tensors):
            name = cur.string()
            dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
            ggml_type, offset = cur.scalar("I"), cur.scalar("Q")
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, offset)
        align = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        self._data_start = -(-cur.pos // align) * align

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The raw bytes of a tensor, shaped [rows..., bytes per row]."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        inner = info.shape[-1]
        if inner % block:
            raise ValueError(f"{self.path}: tensor {info.name} row of {inner} is not a "
                             f"multiple of its block size {block}")
        row_bytes = inner // block * type_size
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        start = self._data_start + info.offset
        assert self._data is not None
        data = self._data[start:start + rows * row_bytes]
        if data.size != rows * row_bytes:
            raise ValueError(f"{self.path}: tensor {info.name} runs past the end of the file")
        return data.reshape(*info.shape[:-1], row_bytes)

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 (any GGML type the gguf package can dequantize)."""
        from gguf import GGMLQuantizationType, quants

        info = self.tensors[name]
        qtype = GGMLQuantizationType(info.ggml_type)
        raw = self.tensor_bytes(info)
        if qtype == GGMLQuantizationType.BF16:
            as_u32 = raw.view(np.uint16).astype(np.uint32) << 16
            return as_u32.view(np.float32).reshape(info.shape)
        block_codec = getattr(quants, qtype.name, None)
        if block_codec is not None and hasattr(block_codec, "dequantize_rows"):
            block_codec.init_grid()
            out = block_codec.dequantize_rows(raw)  # whole tensor at once: fewer numpy calls
        else:
            out = quants.dequantize(raw, qtype)
        return np.asarray(out, dtype=np.float32).reshape(info.shape)
