"""Where the peers' environments live (vLLM CPU, llama.cpp, the converted models).

The one place that reads the environment: `$ANDANTE_PEERS` names the directory (default
`runs/peers` in this checkout, which git ignores), laid out by `benchmarks/peers/setup`;
`$ANDANTE_VLLM_PYTHON`, `$ANDANTE_VLLM_MODEL`, `$ANDANTE_LLAMA_PYTHON` and
`$ANDANTE_LLAMA_BF16_GGUF` override single paths inside it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"
PEERS_DIR = Path(os.environ.get("ANDANTE_PEERS", REPO / "runs" / "peers"))
VLLM_PYTHON = Path(os.environ.get("ANDANTE_VLLM_PYTHON", PEERS_DIR / "vllm-venv/bin/python"))
VLLM_MODEL = Path(os.environ.get("ANDANTE_VLLM_MODEL", PEERS_DIR / "smollm2-135m-instruct"))
LLAMA_PYTHON = Path(os.environ.get("ANDANTE_LLAMA_PYTHON",
                                   PEERS_DIR / "llama-venv/bin/python"))
LLAMA_BF16_GGUF = Path(os.environ.get("ANDANTE_LLAMA_BF16_GGUF",
                                      PEERS_DIR / "smollm2-135m-instruct-bf16.gguf"))
# The peers' benchmark scripts (run with the peers' interpreters).
VLLM_BENCH_SCRIPT = HERE / "vllm_peer" / "vllm_offline_bench.py"
LLAMA_BENCH_SCRIPT = HERE / "peers" / "llama_cpp_bench.py"
