"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest

from tests.peers import VllmPeer, require_vllm_peer


@pytest.fixture(scope="session")
def vllm_peer() -> VllmPeer:
    """The installed vLLM CPU build (skipped where absent, failed where CI requires it)."""
    return require_vllm_peer()
