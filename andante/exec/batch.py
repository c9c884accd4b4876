"""What the scheduler hands an executor each step, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.core.request import Request
from andante.perf.shape import BatchShape


@dataclass(slots=True)
class StepBatch:
    """One engine step.

    `requests[i]` advances by `num_new_tokens[i]` tokens starting at position
    `num_cached_tokens[i]` (its KV lives in `block_tables[i]`, device block ids);
    it samples a next token iff `samples[i]`. Swaps happen before the forward pass:
    `swap_out` holds (device, host) block pairs, `swap_in` (host, device) pairs.
    `released_ids` lists requests that no longer hold KV (finished, aborted or
    preempted by recompute) so executors can drop per-request state.
    """

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_cached_tokens: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    released_ids: list[str] = field(default_factory=list)
    _shape: BatchShape = field(default_factory=BatchShape)  # kept up to date by `add`

    def add(
        self, req: Request, num_new: int, num_cached: int, samples: bool, block_table: list[int]
    ) -> None:
        """Append one request's share of the step."""
        self.requests.append(req)
        self.num_new_tokens.append(num_new)
        self.num_cached_tokens.append(num_cached)
        self.samples.append(samples)
        self.block_tables.append(block_table)
        self._shape.add(num_new, num_cached, samples)

    def add_all(self, reqs: list[Request], num_new: list[int], num_cached: list[int],
                samples: list[bool], block_tables: list[list[int]]) -> None:
        """`add` for each request in turn, in one call (a whole step)."""
        self.requests += reqs
        self.num_new_tokens += num_new
        self.num_cached_tokens += num_cached
        self.samples += samples
        self.block_tables += block_tables
        self._shape.add_all(num_new, num_cached, samples)

    @classmethod
    def decodes(cls, reqs: list[Request], block_tables: list[list[int]]) -> StepBatch:
        """The all-decode step of `reqs` (each advances by one token and samples)."""
        num_cached = [req.num_computed_tokens for req in reqs]
        n = len(reqs)
        return cls(reqs, [1] * n, num_cached, [True] * n, block_tables,
                   _shape=BatchShape.decodes(num_cached))

    @property
    def num_seqs(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.requests and not self.swap_out and not self.swap_in

    def shape(self) -> BatchShape:
        """The step's composition for a cost model."""
        if self._shape.num_seqs == len(self.requests):
            return self._shape
        shape = BatchShape()
        for new, cached, samples in zip(
            self.num_new_tokens, self.num_cached_tokens, self.samples, strict=True
        ):
            shape.add(new, cached, samples)
        return shape


@dataclass(slots=True)
class StepResult:
    """Tokens sampled (aligned with the batch's requests; None where not sampling).

    `duration` is the step's modeled (simulator) or measured (real) wall time in
    seconds; `swap_time` is the part spent moving KV between tiers.
    """

    sampled_token_ids: list[int | None]
    duration: float
    swap_time: float = 0.0
