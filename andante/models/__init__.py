"""Model loading: Llama-family checkpoints from Hugging Face directories or GGUF files."""

from andante.models.config import ModelConfig, RopeScaling
from andante.models.loader import LoadedModel, default_model_path, load_model, load_tokenizer

__all__ = ["LoadedModel", "ModelConfig", "RopeScaling", "default_model_path", "load_model",
           "load_tokenizer"]
