"""StepPlan: the decision a policy builds for one engine step.

A policy never touches the block manager. It asks the plan what fits (`can_schedule`,
`can_preempt`, `can_swap_in`) and records what it wants (`schedule`, `preempt`,
`swap_in`). The plan holds its reservations in the block manager itself, the one owner
of KV feasibility (vLLM v1's `allocate_slots`): `schedule` allocates the blocks,
`preempt` frees or swaps them out, `swap_in` swaps them back, as the policy decides, so
what free blocks remain is always the block manager's own figure. The plan keeps only
the step's token and sequence budgets; the scheduler then changes request states and
queues. Running requests the plan does not schedule simply pause with their KV in place.
A policy that picks its whole batch before making room for it (FastServe §4.1-4.2:
the batch first, then the evictions it needs) `claim`s each request's share of the
budgets as it picks, records its evictions, then `schedule_claims` allocates the
batch's blocks in the order claimed.
With pipeline parallelism several batches are in flight at once: requests of a batch
that has not completed yet (`in_flight_ids`) are left out of `running` by the
scheduler and can be neither scheduled nor preempted until their batch completes.
With prefix caching a waiting request starts at its tentative hit (the scheduler sets
its `num_computed_tokens`): the block manager's figures for it count the shared blocks
(and the free ones among them, which admission takes out of the free count).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from operator import attrgetter
from typing import TYPE_CHECKING, overload

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.kv.block_manager import KVBlockManager

if TYPE_CHECKING:
    from numpy import float64
    from numpy.typing import NDArray

_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.SWAPPED
_request_id = attrgetter("request_id")
_HOLDS_NO_KV = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class StepPlan:
    def __init__(
        self,
        kv: KVBlockManager,
        config: SchedulerConfig,
        now: float,
        waiting: list[Request],
        running: list[Request],
        swapped: list[Request],
        in_flight_ids: Set[str] = frozenset(),
        mode_of: Callable[[Request], PreemptionMode] | None = None,
        max_num_tokens: int | None = None,
    ) -> None:
        self.now = now
        self._max_num_tokens = max_num_tokens  # the scheduler's length limit, if given
        self._mode_of = mode_of  # each request's preemption mode by cost (QLM), if set
        self.in_flight_ids = in_flight_ids  # requests of batches still in the pipeline
        self.config = config
        self.waiting = waiting  # policies may reorder these three lists in place
        self.running = running
        self.swapped = swapped
        self._kv = kv
        self.token_budget = config.max_num_batched_tokens
        self.seq_budget = config.max_num_seqs
        self._init_decisions()
        self.num_active_seqs = len(running)  # KV holders on the device after this step

    def _init_decisions(self) -> None:
        self.scheduled: list[Request] = []
        self.num_scheduled_tokens: list[int] = []
        self.preemptions: list[tuple[Request, PreemptionMode]] = []
        self.swap_ins: list[Request] = []
        self.swap_out_blocks: list[tuple[int, int]] = []  # (device, host) copies
        self.swap_in_blocks: list[tuple[int, int]] = []  # (host, device) copies
        self._scheduled_ids: set[str] = set()
        self._preempted_ids: set[str] = set()
        self._swapped_in_ids: set[str] = set()
        self.claimed: list[Request] = []  # claimed, not scheduled yet (claim order)
        self.num_claimed_tokens: list[int] = []
        self._claimed_ids: set[str] = set()

    # ---- the block manager's figures ------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._kv.num_free_device_blocks

    @property
    def num_free_host_blocks(self) -> int:
        return self._kv.num_free_host_blocks

    @property
    def num_total_blocks(self) -> int:
        return self._kv.num_device_blocks

    @property
    def watermark_blocks(self) -> int:
        """Blocks an admission must leave free (the block manager's watermark)."""
        return self._kv.watermark_blocks

    @property
    def num_blocks_above_watermark(self) -> int:
        """Device blocks admissions may fill: all of them but the watermark."""
        return self._kv.num_blocks_above_watermark

    @property
    def num_free_blocks_above_watermark(self) -> int:
        """Free device blocks an admission may take now (free less the watermark)."""
        return self._kv.num_free_blocks_above_watermark

    @property
    def kv_usage(self) -> float:
        """Fraction of device blocks in use."""
        return self._kv.usage

    def min_free_blocks_below_usage(self, usage: float) -> int:
        """Free device blocks that certainly keep the usage below `usage`."""
        return self._kv.min_free_blocks_below_usage(usage)

    @property
    def block_size(self) -> int:
        return self._kv.block_size

    @overload
    def num_blocks_for(self, num_tokens: int) -> int: ...

    @overload
    def num_blocks_for(self, num_tokens: NDArray[float64]) -> NDArray[float64]: ...

    def num_blocks_for(self, num_tokens: int | NDArray[float64]) -> int | NDArray[float64]:
        """Blocks that hold `num_tokens` tokens (elementwise for an array)."""
        return self._kv.num_blocks_for(num_tokens)

    def max_new_blocks_for(self, num_tokens: int) -> int:
        """The most new blocks `num_tokens` tokens appended to a request may take."""
        return self._kv.max_new_blocks_for(num_tokens)

    @overload
    def num_slots_in(self, num_blocks: int) -> int: ...

    @overload
    def num_slots_in(self, num_blocks: NDArray[float64]) -> NDArray[float64]: ...

    def num_slots_in(self, num_blocks: int | NDArray[float64]) -> int | NDArray[float64]:
        """Tokens that `num_blocks` blocks hold (elementwise for an array)."""
        return self._kv.num_slots_in(num_blocks)

    def num_blocks_of(self, req: Request) -> int:
        """Blocks the request holds now (on the device, or on the host if swapped)."""
        return self._kv.num_blocks_of(req.request_id)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        """New device blocks to advance `req` by `num_tokens` this step."""
        return self._kv.num_new_blocks_needed(req.request_id, req.num_computed_tokens + num_tokens)

    def blocks_short(self, req: Request, num_tokens: int) -> int:
        """More free blocks `req` needs to advance by `num_tokens` (0: they are free;
        an admission's need counts the watermark)."""
        return self._kv.num_blocks_short(req.request_id, req.num_computed_tokens + num_tokens)

    # ---- queries --------------------------------------------------------------------
    def is_scheduled(self, req: Request) -> bool:
        return req.request_id in self._scheduled_ids

    def is_preempted(self, req: Request) -> bool:
        return req.request_id in self._preempted_ids

    def is_in_flight(self, req: Request) -> bool:
        """Is the request part of a batch still in the pipeline (not schedulable)?"""
        return req.request_id in self.in_flight_ids

    @property
    def has_seq_room(self) -> bool:
        """Can one more request join the running set under max_num_seqs?"""
        return self.num_active_seqs < self.config.max_num_seqs

    def _is_schedulable(self, req: Request) -> bool:
        rid = req.request_id
        if rid in self._scheduled_ids or rid in self._preempted_ids:
            return False
        if rid in self.in_flight_ids:
            return False
        return req.status != _SWAPPED or rid in self._swapped_in_ids

    def _fits_budgets(self, req: Request, num_tokens: int) -> bool:
        if num_tokens < 1 or num_tokens > req.num_uncomputed_tokens:
            return False
        if self.seq_budget < 1 or num_tokens > self.token_budget:
            return False
        return self._is_schedulable(req)

    def can_schedule(self, req: Request, num_tokens: int) -> bool:
        if not self._fits_budgets(req, num_tokens):
            return False
        return self._kv.can_allocate(req.request_id, req.num_computed_tokens + num_tokens)

    def max_schedulable_tokens(self, req: Request) -> int:
        """The largest chunk of `req` that fits the budgets and free blocks (0 if none)."""
        if self.seq_budget < 1 or not self._is_schedulable(req):
            return 0
        capacity = self._kv.max_num_tokens_for(req.request_id) - req.num_computed_tokens
        return max(0, min(req.num_uncomputed_tokens, self.token_budget, capacity))

    def can_reserve_prefill(self, req: Request) -> bool:
        """Would the request's whole remaining prefill fit in free blocks (with watermark)?"""
        return self._kv.can_allocate(req.request_id, req.num_tokens)

    def can_preempt(self, req: Request, mode: PreemptionMode) -> bool:
        rid = req.request_id
        if req.status != _RUNNING or rid in self._scheduled_ids or rid in self._preempted_ids:
            return False
        if rid in self.in_flight_ids:
            return False
        return mode != PreemptionMode.SWAP or self._kv.can_swap_out(rid)

    @property
    def max_num_tokens(self) -> int:
        """The most tokens a request may hold: the context, or the whole KV cache
        (`Scheduler.max_num_tokens`, the length limit of `check_stop`, where the
        scheduler gives it; else as it computes it)."""
        if self._max_num_tokens is not None:
            return self._max_num_tokens
        kv = self._kv
        return min(self.config.max_model_len, kv.num_device_blocks * kv.block_size)

    def admits_none_of(self, queued: Iterable[Request], running: Iterable[Request],
                       whole_within: int | None = None) -> bool:
        """Is no request of `queued` (waiting or swapped) admissible, even for one token,
        by its device blocks (`whole_within`: for all its tokens, within this token
        budget), in this step and in the next ones for as long as they only advance
        `running` (the free blocks only shrink, and `running` register no block in
        the prefix cache that a waiting request's hit could grow by)? Other budgets
        aside (a sufficient condition: the policy's order among them decides nothing)."""
        kv = self._kv
        if kv.registers_more(map(_request_id, running)):
            return False
        refuses = kv.refuses_for_now
        if whole_within is None:
            return all(refuses(req.request_id, req.num_computed_tokens + 1) for req in queued)
        settled = kv.hit_is_settled
        return all(refuses(req.request_id, req.num_tokens) or (
            req.status != _SWAPPED and req.num_uncomputed_tokens > whole_within
            and settled(req.request_id)) for req in queued)

    def can_swap_in(self, req: Request, num_tokens: int = 0) -> bool:
        """Could the swapped request come back (with room to advance `num_tokens`)?"""
        if req.status != _SWAPPED or req.request_id in self._swapped_in_ids:
            return False
        return self._kv.can_swap_in(req.request_id, self.blocks_needed(req, num_tokens))

    def preemption_mode_for(self, req: Request) -> PreemptionMode:
        """The configured mode (or the request's own, where the scheduler chooses per
        request: QLM's Insight #2), falling back to recompute when the host tier is full."""
        mode = self.config.preemption_mode if self._mode_of is None else self._mode_of(req)
        if mode == PreemptionMode.SWAP and not self._kv.can_swap_out(req.request_id):
            return PreemptionMode.RECOMPUTE
        return mode

    # ---- decisions ------------------------------------------------------------------
    def restrict_token_budget(self, max_tokens: int) -> None:
        """Tighten this step's token budget (chunked-prefill policies)."""
        self.token_budget = min(self.token_budget, max_tokens)

    def schedule(self, req: Request, num_tokens: int) -> None:
        """Advance `req` by `num_tokens` this step, allocating its blocks now."""
        total = req.num_computed_tokens + num_tokens
        if not self._fits_budgets(req, num_tokens) or (
            self._kv.allocate_slots(req.request_id, total) is None
        ):
            raise ValueError(f"cannot schedule {num_tokens} tokens of {req.request_id!r}")
        if req.status in _HOLDS_NO_KV:
            self.num_active_seqs += 1
        self.token_budget -= num_tokens
        self.seq_budget -= 1
        self._scheduled_ids.add(req.request_id)
        self.scheduled.append(req)
        self.num_scheduled_tokens.append(num_tokens)

    def can_claim(self, num_tokens: int) -> bool:
        """Would one more request advancing `num_tokens` fit the budgets left?"""
        return self.seq_budget >= 1 and num_tokens <= self.token_budget

    def claim(self, req: Request, num_tokens: int) -> None:
        """Take `num_tokens` of the step's token budget and one sequence for `req` now,
        before its blocks exist (the request may still be swapped or need evictions)."""
        rid = req.request_id
        if not 1 <= num_tokens <= self.token_budget or self.seq_budget < 1 \
                or rid in self._claimed_ids:
            raise ValueError(f"cannot claim {num_tokens} tokens of {rid!r}")
        self.token_budget -= num_tokens
        self.seq_budget -= 1
        self._claimed_ids.add(rid)
        self.claimed.append(req)
        self.num_claimed_tokens.append(num_tokens)

    def is_claimed(self, req: Request) -> bool:
        """Was `req` claimed this step (whether scheduled since or not)?"""
        return req.request_id in self._claimed_ids

    def schedule_claims(self) -> None:
        """Schedule the claimed requests in claim order, allocating their blocks now
        (runs of decodes on the fast path); a claim that cannot be scheduled (its blocks
        are not free, or it is still swapped) lapses and its budget returns."""
        requests, num_tokens = self.claimed, self.num_claimed_tokens
        self.claimed, self.num_claimed_tokens = [], []
        self.token_budget += sum(num_tokens)  # the schedules below take them again
        self.seq_budget += len(requests)
        index = 0
        while index < len(requests):
            index = self.schedule_decodes(requests, index)
            if index < len(requests):
                req, n = requests[index], num_tokens[index]
                if self.can_schedule(req, n):
                    self.schedule(req, n)
                index += 1

    def schedule_decodes(self, order: list[Request], start: int = 0) -> int:
        """Fast path: one token for each running, decoding request of `order[start:]`, in
        order; returns the index of the first one it did not schedule (len if none)."""
        scheduled_ids, preempted_ids, in_flight = (
            self._scheduled_ids, self._preempted_ids, self.in_flight_ids
        )
        kv = self._kv
        block_size, blocks_of = kv.block_size, kv.num_device_blocks_of
        end = min(len(order), start + max(0, min(self.seq_budget, self.token_budget)))
        index = start
        while index < end:
            req = order[index]
            rid = req.request_id
            if req.status != _RUNNING or rid in scheduled_ids or rid in preempted_ids:
                break
            if rid in in_flight:
                break
            computed = req.num_computed_tokens
            if req.num_tokens - computed != 1:
                break
            # its blocks cover its computed tokens: only a full last block can overflow
            crosses_block = not computed % block_size and computed // block_size + 1 > \
                blocks_of(rid)
            if crosses_block and kv.allocate_slots(rid, computed + 1) is None:
                break
            index += 1
        count = index - start
        if count:
            added = order[start:index]
            self.token_budget -= count
            self.seq_budget -= count
            scheduled_ids.update(r.request_id for r in added)
            self.scheduled += added
            self.num_scheduled_tokens += [1] * count
        return index

    def preempt(self, req: Request, mode: PreemptionMode) -> None:
        """Pause a running request, freeing its device blocks now (to the host tier
        if `mode` is swap)."""
        if not self.can_preempt(req, mode):
            raise ValueError(f"cannot preempt {req.request_id!r} by {mode.name}")
        if mode == PreemptionMode.SWAP:
            self.swap_out_blocks.extend(self._kv.swap_out(req.request_id))
        else:
            self._kv.free(req.request_id, resumes=True)
        self.num_active_seqs -= 1
        self._preempted_ids.add(req.request_id)
        self.preemptions.append((req, mode))

    def swap_in(self, req: Request) -> None:
        """Bring a swapped request's blocks back to the device now."""
        if not self.can_swap_in(req):
            raise ValueError(f"cannot swap in {req.request_id!r}")
        self.swap_in_blocks.extend(self._kv.swap_in(req.request_id))
        self._swapped_in_ids.add(req.request_id)
        self.num_active_seqs += 1
        self.swap_ins.append(req)
