"""andante: an LLM serving system that schedules by the user's experience."""

__version__ = "0.1.0"
