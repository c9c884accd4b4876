"""Load a Hugging Face model directory: config.json, *.safetensors, tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from andante.models.config import config_from_hf
from andante.models.tokenizer import TextTokenizer, tokenizer_from_hf_dir
from andante.models.weights import ModelWeights, build_weights
from andante.perf.specs import ModelSpec


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def read_config(directory: Path) -> ModelSpec:
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{directory} is not a model directory: no config.json")
    try:
        return config_from_hf(_read_json(path), directory.name)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _tensor_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map", {})
        files = sorted({directory / str(name) for name in weight_map.values()})
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory}: no *.safetensors weights found")
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{directory}: missing weight file {missing[0].name}")
    return files


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, by name (memory-mapped)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in _tensor_files(directory):
        try:
            tensors.update(load_file(path))
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    return tensors


def load_hf_dir(directory: Path, dtype: torch.dtype
                ) -> tuple[ModelSpec, ModelWeights, TextTokenizer]:
    config = read_config(directory)
    tensors = load_tensors(directory)
    weights = build_weights(config, tensors.get, str(directory), dtype)
    del tensors
    return config, weights, tokenizer_from_hf_dir(directory)
