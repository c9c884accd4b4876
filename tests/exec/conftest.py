"""Fixtures shared with tests/models: the tiny random checkpoint."""

from tests.models.conftest import _few_threads, tiny_llama  # noqa: F401
