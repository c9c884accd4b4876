"""Scheduler limits shared by every policy."""

from __future__ import annotations

from dataclasses import dataclass

from andante.core.request import PreemptionMode


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Budgets of one engine instance.

    max_num_seqs and max_num_batched_tokens bound one step's batch (vLLM's names); a
    budget below max_model_len needs a policy that chunks prefills (the Scheduler checks);
    max_model_len bounds a request's prompt + output; watermark is the share of device
    blocks kept free when admitting; preemption_mode is the default mechanism;
    enable_prefix_caching shares cached full blocks of equal prefixes (vLLM's APC);
    max_model_len_set_by names the option that set max_model_len below the model's
    context (refusals then name it), None where it is the model's own.
    """

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    watermark: float = 0.01
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE
    enable_prefix_caching: bool = True
    max_model_len_set_by: str | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
