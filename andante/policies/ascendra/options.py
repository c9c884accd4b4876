"""Tunables of Ascendra's LP and HP instance policies (defaults: the paper's and its code's).

TTFT SLO 1 s and TBT SLO 0.15 s apply to requests that carry none; batch size 128.
"""

from __future__ import annotations

from dataclasses import dataclass

from andante.policies.ascendra.values import value_function


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RefitOptions:
    """The online refit of the performance model, shared by LP and HP: refit_every:
    steps between refits (0: never); window: steps the fit uses; tolerance: no refit
    while the error stays below it."""

    refit_every: int = 256
    window: int = 512
    tolerance: float = 0.03


@dataclass(frozen=True, slots=True)
class LPOptions(RefitOptions):
    """value: ordering of waiting prefills (edf, sjf, fcfs, ljf). Algorithm 1's budgets:
    token_budget (N, tokens per step), C: predicted step time while the step also
    decodes, at most step_budget seconds if given, else tbt_share x the tightest TBT SLO
    of the decoding requests; M: free KV blocks (from the plan). chunk: the
    first prefill that does not fit whole runs a chunk of at least min_chunk tokens.
    offload: hand at-risk requests back (§5.3), judged against a worst-case HP batch of
    hp_batch_tokens prompt tokens. ttft_slo / tbt_slo: for requests without their own."""

    value: str = "edf"
    token_budget: int = 2048
    step_budget: float | None = None
    tbt_share: float = 2 / 3
    chunk: bool = True
    min_chunk: int = 64
    offload: bool = True
    hp_batch_tokens: int = 2048
    ttft_slo: float = 1.0
    tbt_slo: float = 0.15

    def __post_init__(self) -> None:
        value_function(self.value)
        _positive("ascendra-lp", token_budget=self.token_budget, tbt_share=self.tbt_share,
                  step_budget=1.0 if self.step_budget is None else self.step_budget,
                  min_chunk=self.min_chunk, hp_batch_tokens=self.hp_batch_tokens,
                  ttft_slo=self.ttft_slo, tbt_slo=self.tbt_slo, window=self.window)


@dataclass(frozen=True, slots=True)
class HPOptions(RefitOptions):
    """base_batch: the batch size kept without elastic growth; elastic (§6.2): admit
    beyond it while more than free_kv_share of the KV cache stays free after reserving
    the expected decode growth of the running requests. token_budget: prompt tokens per
    prefill step (one longer prompt runs alone). mixed: decodes ride along in prefill steps
    (no decode stall); False: they wait for a step without prefills, as in vLLM v0, on which
    the paper built HP instances (its "occasional decode stalls")."""

    base_batch: int = 128
    elastic: bool = True
    mixed: bool = True
    free_kv_share: float = 0.10
    token_budget: int = 2048
    ttft_slo: float = 1.0

    def __post_init__(self) -> None:
        _positive("ascendra-hp", base_batch=self.base_batch, token_budget=self.token_budget,
                  ttft_slo=self.ttft_slo, window=self.window)
        if not 0 <= self.free_kv_share < 1:
            raise ValueError(f"ascendra-hp: free_kv_share must be in [0, 1), "
                             f"got {self.free_kv_share!r}")
