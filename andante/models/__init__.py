"""Model loading: Llama-family checkpoints from Hugging Face directories or GGUF files.

The loader (and torch) loads on first use of a name below (PEP 562): importing
`andante.models.interface` alone, as the fleet front does, stays torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from andante.models.loader import LoadedModel, default_model_path, load_model, load_tokenizer

__all__ = ["LoadedModel", "default_model_path", "load_model", "load_tokenizer"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'andante.models' has no attribute {name!r}")
    from andante.models import loader

    return getattr(loader, name)
