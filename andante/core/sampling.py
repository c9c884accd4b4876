"""Sampling parameters and per-request service-level objectives (validated on creation)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


#: TTFT target when the SLO gives none (seconds); DESIGN.md §6 uses max(prefill, 1 s).
DEFAULT_TTFT_TARGET = 1.0
#: Reading speed when the SLO gives none (tokens/s): Andes Fig. 4's faster reader.
DEFAULT_TDS = 4.8


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request objectives, all optional.

    ttft: seconds from arrival to the first token; tbt: seconds between tokens;
    tds: the reader's pace in tokens/s (Andes' token delivery speed);
    deadline: seconds from arrival to the last token.
    """

    ttft: float | None = None
    tbt: float | None = None
    tds: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft", "tbt", "tds", "deadline"):
            _check_positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    eos_token_id: int | None = field(default=None)
    #: vLLM's penalties and filters (vllm/sampling_params.py): repetition_penalty scales
    #: the logits of tokens seen in the prompt or output (1 = off); presence and frequency
    #: penalties subtract per output token seen / per occurrence (0 = off); min_p drops
    #: tokens below min_p x the top token's probability (0 = off); min_tokens bars stop
    #: tokens and stop strings until that many tokens are out.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self._check_penalties()

    def _check_penalties(self) -> None:
        """vLLM's ranges (SamplingParams._verify_args)."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens}")

    @property
    def has_penalties(self) -> bool:
        """Whether the logits need vLLM's penalties before any sampling (greedy too)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
