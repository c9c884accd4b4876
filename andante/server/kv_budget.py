"""The default KV pool of a real model, sized from the model and the machine.

Design note (vLLM sizes its KV cache from a memory budget: `gpu_memory_utilization` of
the device, or `VLLM_CPU_KVCACHE_SPACE` on a CPU): the pool never needs more than
`max_num_seqs` sequences at the full context (no more run at once), so andante takes
that, capped at `KV_MEMORY_SHARE` of the memory available when the server starts (on a
CPU the KV shares the RAM with everything else) and floored at one full context (every
prompt the context allows can run). `--kv-cache-gib` or `--num-kv-blocks` override it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30
KV_MEMORY_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class KVBudget:
    num_tokens: int
    bytes_per_token: int
    reason: str

    @property
    def gib(self) -> float:
        return self.num_tokens * self.bytes_per_token / GIB

    def describe(self) -> str:
        return (f"KV cache: {self.num_tokens:,} tokens ({self.gib:.2f} GiB at "
                f"{self.bytes_per_token / 1024:.0f} KiB per token): {self.reason}; "
                "--kv-cache-gib or --num-kv-blocks set it")


def available_memory() -> int | None:
    """Bytes of memory available now (Linux's MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def plan_kv(bytes_per_token: int, max_model_len: int, max_num_seqs: int,
            available: int | None) -> KVBudget:
    """The default pool for a model with `bytes_per_token` of KV per token."""
    if bytes_per_token < 1:
        raise ValueError(f"bytes_per_token must be >= 1, got {bytes_per_token}")
    full = max_num_seqs * max_model_len
    need = f"{max_num_seqs} sequences x {max_model_len} tokens"
    if available is None:
        share = 1 << 30  # unknown machine: 1 GiB
        where = "1 GiB (the available memory is unknown)"
    else:
        share = int(KV_MEMORY_SHARE * available)
        where = (f"{KV_MEMORY_SHARE:.0%} of the {available / GIB:.1f} GiB of memory "
                 "available")
    cap = share // bytes_per_token
    if full <= cap:
        return KVBudget(full, bytes_per_token, f"{need}, the most that can run at once "
                        f"(within {where})")
    if cap < max_model_len:
        return KVBudget(max_model_len, bytes_per_token, f"one full context ({where} holds "
                        f"only {cap:,} tokens)")
    return KVBudget(cap, bytes_per_token, f"{where} ({need} would need "
                    f"{full * bytes_per_token / GIB:.1f} GiB)")
