"""FastServe (Wu et al., 2023): skip-join MLFQ with proactive KV-cache swapping."""

from andante.policies.fastserve.policy import (
    FastServeFCFSPolicy,
    FastServeOptions,
    FastServePolicy,
)

__all__ = ["FastServeFCFSPolicy", "FastServeOptions", "FastServePolicy"]
