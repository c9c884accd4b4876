"""Per-request SLO and QoE parameters (DESIGN §6; Andes §6.1 "QoE Parameters").

TTFT target: max(prompt_len / prefill_throughput, min_ttft), Andes' rule with its
5,000 tokens/s prefill throughput and 1 s floor: longer prompts may expect a
proportionally longer first-token wait.

Reading speed (tds, tokens/s). Andes assigns each request a reading speed from the
human reading-speed distribution of its Fig. 2(a) (reading speed by age group, one word
= 1.3 tokens). The text gives only the representative figures: reading 4.8 tokens/s
(≈ 220 words/min) and listening 3.3 tokens/s (≈ 150 words/min, typical speech), so we
cannot copy the figure's bars. We use instead:

* "reading" (default) — five points spread symmetrically around the representative
  reader, mean exactly 4.8 tokens/s, range 3.3–6.5 tokens/s (≈ 150–300 words/min, the
  span from a slow reader at speaking pace to a fast adult reader):
  3.3 (10 %), 4.0 (20 %), 4.8 (40 %), 5.5 (20 %), 6.5 (10 %).
  It keeps the figure's point (readers differ by roughly 2× between slow and fast)
  without claiming per-age-group precision we do not have.
* "reading-listening" — the two representative values as a mix: 4.8 tokens/s for
  readers, 3.3 tokens/s for listeners (synthesised speech), half each.
* a fixed value for every request (`SLOConfig.tds`), or none (`tds_distribution="none"`).

TBT and deadline are optional: a fixed TBT, and deadline = deadline + deadline_per_token
× output_len (either term may be left out; both out means no deadline).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from andante.core.sampling import SLO

ANDES_PREFILL_THROUGHPUT = 5000.0  # tokens/s, Andes §6.1
WORDS_TO_TOKENS = 1.3  # tokens per word, Andes Fig. 2
READING_TDS = 4.8  # tokens/s, Andes Fig. 4 caption
LISTENING_TDS = 3.3  # tokens/s, Andes Fig. 4 caption


@dataclass(frozen=True, slots=True)
class DiscreteDistribution:
    """A distribution over a few values; `probs` must sum to 1."""

    values: tuple[float, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.probs):
            raise ValueError(f"values and probs must be non-empty and equally long: {self}")
        if any(p < 0 for p in self.probs) or not math.isclose(sum(self.probs), 1.0):
            raise ValueError(f"probs must be >= 0 and sum to 1, got {self.probs}")

    @property
    def mean(self) -> float:
        return sum(v * p for v, p in zip(self.values, self.probs, strict=True))

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(np.array(self.values), size=num, p=np.array(self.probs))


READING = DiscreteDistribution((3.3, 4.0, 4.8, 5.5, 6.5), (0.1, 0.2, 0.4, 0.2, 0.1))
READING_LISTENING = DiscreteDistribution((READING_TDS, LISTENING_TDS), (0.5, 0.5))
TDS_DISTRIBUTIONS = ("reading", "reading-listening", "none")


def tds_distribution(name: str) -> DiscreteDistribution | None:
    """The named reading-speed distribution (None for "none")."""
    if name == "reading":
        return READING
    if name == "reading-listening":
        return READING_LISTENING
    if name == "none":
        return None
    raise ValueError(f"unknown tds distribution {name!r}; expected one of {TDS_DISTRIBUTIONS}")


def _check_optional_positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class SLOConfig:
    """How SLOs are assigned. `ttft`/`tds` fixed values override the per-request rules."""

    prefill_throughput: float = ANDES_PREFILL_THROUGHPUT
    min_ttft: float = 1.0
    ttft: float | None = None
    tds_distribution: str = "reading"
    tds: float | None = None
    tbt: float | None = None
    deadline: float | None = None
    deadline_per_token: float | None = None

    def __post_init__(self) -> None:
        for name in ("prefill_throughput", "min_ttft"):
            _check_optional_positive(name, getattr(self, name))
        for name in ("ttft", "tds", "tbt", "deadline", "deadline_per_token"):
            _check_optional_positive(name, getattr(self, name))
        tds_distribution(self.tds_distribution)


def ttft_targets(
    prompt_lens: np.ndarray,
    prefill_throughput: float = ANDES_PREFILL_THROUGHPUT,
    min_ttft: float = 1.0,
) -> np.ndarray:
    """Andes' TTFT target per request: max(prompt_len / prefill_throughput, min_ttft)."""
    return np.maximum(np.asarray(prompt_lens, dtype=np.float64) / prefill_throughput, min_ttft)


def sample_tds(num: int, rng: np.random.Generator, distribution: str = "reading") -> np.ndarray:
    """Reading speeds (tokens/s) for `num` requests; NaN for distribution "none"."""
    dist = tds_distribution(distribution)
    if dist is None:
        return np.full(num, np.nan)
    return dist.sample(num, rng)


def assign_slos(
    prompt_lens: Sequence[int] | np.ndarray,
    output_lens: Sequence[int] | np.ndarray,
    config: SLOConfig,
    rng: np.random.Generator,
) -> list[SLO]:
    """One SLO per request, following `config` (see the module note)."""
    prompts = np.asarray(prompt_lens, dtype=np.int64)
    outputs = np.asarray(output_lens, dtype=np.int64)
    if prompts.shape != outputs.shape:
        raise ValueError(f"{len(prompts)} prompt lengths but {len(outputs)} output lengths")
    num = len(prompts)
    if config.ttft is not None:
        ttfts = np.full(num, config.ttft)
    else:
        ttfts = ttft_targets(prompts, config.prefill_throughput, config.min_ttft)
    if config.tds is not None:
        tds = np.full(num, config.tds)
    else:
        tds = sample_tds(num, rng, config.tds_distribution)
    deadlines: np.ndarray | None = None
    if config.deadline is not None or config.deadline_per_token is not None:
        deadlines = (config.deadline or 0.0) + (config.deadline_per_token or 0.0) * outputs
    return [
        SLO(
            ttft=float(ttfts[i]),
            tbt=config.tbt,
            tds=None if math.isnan(tds[i]) else float(tds[i]),
            deadline=None if deadlines is None else float(deadlines[i]),
        )
        for i in range(num)
    ]
