"""What one `andes` step decided, and counters over a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.core.request import Request


@dataclass(slots=True)
class AndesStats:
    num_solves: int = 0  # knapsack invocations (selective triggering let them run)
    num_pairs_kept: int = 0  # admission/preemption pairs the refiner kept
    num_pairs_cancelled: int = 0  # ... and cancelled
    num_preemptions: int = 0  # preemptions the policy chose
    num_shortage_preemptions: int = 0  # preemptions forced by a decode out of blocks


@dataclass(slots=True)
class Decision:
    admits: list[Request] = field(default_factory=list)  # in the order to try
    victims: list[Request] = field(default_factory=list)  # preempt now
    decode_order: list[Request] = field(default_factory=list)  # highest priority first
