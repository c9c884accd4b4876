"""Write a tiny checkpoint as a GGUF file the way llama.cpp's converter would."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from andante.models.gguf_model import gguf_name
from tests.models.helpers import CHAT_TEMPLATE, SPECIALS, VOCAB_SIZE


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def gpt2_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of a 320-token byte-level BPE vocabulary."""
    byte_chars = _bytes_to_unicode()
    tokens = [*SPECIALS, *byte_chars]
    merges: list[str] = []
    space = byte_chars[ord(" ")]
    pairs = [(space, c) for c in "abcdefghijklmnopqrstuvwxyz"]
    pairs += [(a, b) for a in "thaeiou" for b in "hnrst" if a != b]
    for a, b in pairs:
        if len(tokens) == VOCAB_SIZE:
            break
        if a + b not in tokens:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, merges, types


def _permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (HF half-split -> interleaved rotary rows)."""
    return (w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(hf_dir: Path, path: Path, quantize: tuple[str, ...] = ()) -> Path:
    """The safetensors model of `hf_dir` as a llama GGUF; tensors whose GGUF name
    contains one of `quantize` are stored as Q8_0."""
    import json

    from gguf import GGMLQuantizationType, GGUFWriter, quants
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny-test")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    tokens, merges, types = gpt2_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for hf_name, array in load_file(hf_dir / "model.safetensors").items():
        name = gguf_name(hf_name)
        array = array.astype(np.float32)
        if ".attn_q." in name:
            array = _permute(array, heads)
        elif ".attn_k." in name:
            array = _permute(array, kv_heads)
        if any(q in name for q in quantize):
            qtype = GGMLQuantizationType.Q8_0
            writer.add_tensor(name, quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
