"""Fixtures: a tiny random Llama checkpoint on disk and its transformers reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.helpers import make_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))
