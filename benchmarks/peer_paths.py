"""Where the peers' environments live (vLLM CPU's venv, the converted model).

One place reads the environment: `$ANDANTE_PEERS` names the directory (default
`runs/peers` in this checkout, which git ignores); `$ANDANTE_VLLM_PYTHON` and
`$ANDANTE_VLLM_MODEL` override the two paths inside it. Setup: benchmarks/vllm_peer.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = Path(os.environ.get("ANDANTE_PEERS", REPO / "runs" / "peers"))
VLLM_PYTHON = Path(os.environ.get("ANDANTE_VLLM_PYTHON", PEERS_DIR / "vllm-venv/bin/python"))
VLLM_MODEL = Path(os.environ.get("ANDANTE_VLLM_MODEL", PEERS_DIR / "smollm2-135m-instruct"))
