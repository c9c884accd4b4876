"""Where tests find the real vLLM CPU build (the peer and the engine `andante.vllm` plugs
into), installed by `scripts/bootstrap-test.sh` through `benchmarks/peers/setup`.

Tests that need it take the `vllm_peer` fixture. Where it is missing they are skipped,
except when `ANDANTE_REQUIRE_VLLM=1` (set by `.ci/run`): then a missing install fails the
test, so CI never passes by skipping the real thing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = Path(os.environ.get("ANDANTE_PEERS", REPO / "runs" / "peers"))


@dataclass(frozen=True, slots=True)
class VllmPeer:
    """The vLLM venv's interpreter and the embedded model converted to safetensors."""

    python: Path
    model: Path


def find_vllm_peer() -> VllmPeer | None:
    python = Path(os.environ.get("ANDANTE_VLLM_PYTHON", PEERS_DIR / "vllm-venv/bin/python"))
    model = Path(os.environ.get("ANDANTE_VLLM_MODEL", PEERS_DIR / "smollm2-135m-instruct"))
    ready = (python.parent.parent / ".andante-ready").is_file() or python.is_file()
    if ready and (model / "config.json").is_file():
        return VllmPeer(python=python, model=model)
    return None


def require_vllm_peer() -> VllmPeer:
    peer = find_vllm_peer()
    if peer is not None:
        return peer
    message = (f"vLLM CPU peer not installed under {PEERS_DIR} "
               "(benchmarks/peers/setup --only vllm --only model)")
    if os.environ.get("ANDANTE_REQUIRE_VLLM") == "1":
        pytest.fail(message)
    pytest.skip(message)
