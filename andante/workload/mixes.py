"""QLM's workload mixes (§8): which model each request asks for, its end-to-end SLO, and
mega prompts.

Design note (QLM §8 "Workloads"): W_A multi-model — more models than instances, more
than half of them "tail models" asked for only occasionally, each request type with its
own SLO (latency-sensitive: completion-time SLO under 30 s; batch: several minutes);
W_B single model with the same two SLO classes; W_C = W_A plus a few "mega prompts" whose
many input and output tokens occupy much of a GPU's memory. The paper gives no exact
shares; `tail_share` (the share of requests for tail models, Fig. 8's x-axis) and
`latency_share` (Fig. 9/12's x-axis) are the knobs, and the defaults below are ours:
latency-sensitive deadline 20 s (under the paper's 30 s), batch 300 s ("several
minutes"), mega prompts of 3,000 + 1,000 tokens (a 4,096-token context nearly full).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from andante.core.sampling import SLO
from andante.workload.spec import RequestSpec

LATENCY_DEADLINE_S = 20.0
BATCH_DEADLINE_S = 300.0
MEGA_PROMPT_LEN, MEGA_OUTPUT_LEN = 3000, 1000


def _check_share(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def head_tail_weights(models: Sequence[str], num_head: int, tail_share: float
                      ) -> dict[str, float]:
    """Request shares: the first `num_head` models split 1 - tail_share evenly, the
    others (the tail models) split tail_share evenly."""
    _check_share("tail_share", tail_share)
    if not 1 <= num_head <= len(models):
        raise ValueError(f"num_head must be in [1, {len(models)}], got {num_head!r}")
    tail = len(models) - num_head
    if tail == 0:
        return {m: 1.0 / num_head for m in models}
    return {m: ((1.0 - tail_share) / num_head if i < num_head else tail_share / tail)
            for i, m in enumerate(models)}


def parse_model_mix(text: str) -> dict[str, float]:
    """"a:3,b:1" -> {"a": 0.75, "b": 0.25} (weights normalised; a bare name weighs 1)."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, raw = item.partition(":")
        try:
            weight = float(raw) if raw else 1.0
        except ValueError:
            raise ValueError(f"bad model weight in {item!r}: expected NAME:WEIGHT") from None
        if not name or weight <= 0:
            raise ValueError(f"bad model mix entry {item!r}: expected NAME:WEIGHT, weight > 0")
        weights[name] = weight
    if not weights:
        raise ValueError(f"empty model mix {text!r}")
    total = sum(weights.values())
    return {m: w / total for m, w in weights.items()}


def format_model_mix(weights: dict[str, float]) -> str:
    """The `parse_model_mix` text of `weights` (exact: floats keep their repr)."""
    return ",".join(f"{name}:{weight!r}" for name, weight in weights.items() if weight > 0)


def assign_models(specs: Sequence[RequestSpec], weights: dict[str, float], seed: int = 0
                  ) -> list[RequestSpec]:
    """Each request asks for a model drawn with probability `weights[model]`."""
    names = list(weights)
    probs = np.array([weights[m] for m in names], dtype=float)
    if not names or (probs < 0).any() or probs.sum() <= 0:
        raise ValueError(f"model weights must be non-negative and not all 0, got {weights!r}")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(names), size=len(specs), p=probs / probs.sum())
    return [dataclasses.replace(s, model=names[k]) for s, k in zip(specs, picks, strict=True)]


def assign_deadlines(specs: Sequence[RequestSpec], latency_share: float, seed: int = 0,
                     latency_deadline: float = LATENCY_DEADLINE_S,
                     batch_deadline: float = BATCH_DEADLINE_S) -> list[RequestSpec]:
    """A `latency_share` of the requests gets the latency-sensitive deadline, the rest
    the batch one (end-to-end SLOs, QLM §2)."""
    _check_share("latency_share", latency_share)
    rng = np.random.default_rng(seed + 1)
    latency = rng.random(len(specs)) < latency_share
    return [dataclasses.replace(s, slo=dataclasses.replace(
        s.slo, deadline=latency_deadline if ls else batch_deadline))
        for s, ls in zip(specs, latency, strict=True)]


def add_mega_prompts(specs: Sequence[RequestSpec], share: float, seed: int = 0,
                     prompt_len: int = MEGA_PROMPT_LEN, output_len: int = MEGA_OUTPUT_LEN
                     ) -> list[RequestSpec]:
    """W_C: a `share` of the requests become mega prompts (batch SLO kept as drawn)."""
    _check_share("share", share)
    rng = np.random.default_rng(seed + 2)
    mega = rng.random(len(specs)) < share
    return [dataclasses.replace(s, prompt_len=prompt_len, output_len=output_len) if m else s
            for s, m in zip(specs, mega, strict=True)]


def slo_class(slo: SLO) -> str:
    """The SLO class of a request for grouping: its deadline ('none' without one)."""
    return "none" if slo.deadline is None else f"{slo.deadline:g}s"
