"""Model loading: Llama-family checkpoints from Hugging Face directories or GGUF files."""

from andante.models.loader import LoadedModel, default_model_path, load_model, load_tokenizer

__all__ = ["LoadedModel", "default_model_path", "load_model", "load_tokenizer"]
