"""andante's scheduling policies inside vLLM: a vLLM v1 scheduler class.

    vllm serve MODEL --scheduler-cls andante.vllm.Scheduler --no-async-scheduling \
        --additional-config '{"andante": {"policy": "andes"}}'

Optional: install with `pip install "andante[vllm]"` into vLLM's environment (andante's
core never imports vLLM; vLLM and torch are not andante dependencies). `Scheduler` is
imported on first use, so `import andante.vllm` works without vLLM (its settings and
checks, andante.vllm.config, need none).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Scheduler"]


def __getattr__(name: str) -> Any:
    if name == "Scheduler":
        from andante.vllm.scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'andante.vllm' has no attribute {name!r}")
