"""StepPlan: the decision a policy builds for one engine step.

A policy never touches the block manager. It asks the plan what fits (`can_schedule`,
`can_preempt`, `can_swap_in`) and records what it wants (`schedule`, `preempt`,
`swap_in`); the plan keeps a running account of free device and host blocks and of
the step's token and sequence budgets, so every decision it accepts is feasible when
the scheduler applies it (preemptions first, then swap-ins, then allocations).
Running requests the plan does not schedule simply pause with their KV in place.
With pipeline parallelism several batches are in flight at once: requests of a batch
that has not completed yet (`in_flight_ids`) are left out of `running` by the
scheduler and can be neither scheduled nor preempted until their batch completes.
"""

from __future__ import annotations

from collections.abc import Set

from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.kv.block_manager import KVBlockManager

_RUNNING = RequestStatus.RUNNING
_SWAPPED = RequestStatus.SWAPPED
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
    ) -> None:
        self.now = now
        self.in_flight_ids = in_flight_ids  # requests of batches still in the pipeline
        self.config = config
        self.waiting = waiting  # policies may reorder these three lists in place
        self.running = running
        self.swapped = swapped
        self._init_accounts(kv, config)
        self.scheduled: list[Request] = []
        self.num_scheduled_tokens: list[int] = []
        self.preemptions: list[tuple[Request, PreemptionMode]] = []
        self.swap_ins: list[Request] = []
        self._scheduled_ids: set[str] = set()
        self._preempted_ids: set[str] = set()
        self._swapped_in_ids: set[str] = set()
        self.num_active_seqs = len(running)  # KV holders on the device after this step

    def _init_accounts(self, kv: KVBlockManager, config: SchedulerConfig) -> None:
        self._kv = kv
        self._block_size = kv.block_size
        self.num_free_blocks = kv.num_free_device_blocks
        self.num_free_host_blocks = kv.num_free_host_blocks
        self.token_budget = config.max_num_batched_tokens
        self.seq_budget = config.max_num_seqs
        self._watermark_blocks = kv.watermark_blocks

    # ---- queries --------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return self._kv.num_device_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def watermark_blocks(self) -> int:
        """Blocks an admission must leave free (the block manager's watermark)."""
        return self._kv.watermark_blocks

    def num_blocks_of(self, req: Request) -> int:
        """Device blocks the request holds now (host blocks if swapped)."""
        if req.status == _SWAPPED:
            return self._kv.num_host_blocks_of(req.request_id)
        return self._kv.num_device_blocks_of(req.request_id)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        """New device blocks to advance `req` by `num_tokens` this step."""
        total = req.num_computed_tokens + num_tokens
        need = -(-total // self._block_size)
        if req.status == _RUNNING or req.status == _SWAPPED:
            need -= self.num_blocks_of(req)
        return max(0, need)

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

    def _admission_reserve(self, req: Request) -> int:
        """Admissions leave the watermark free; requests holding KV may use it."""
        return self._watermark_blocks if req.status in _HOLDS_NO_KV else 0

    def _is_schedulable(self, req: Request) -> bool:
        rid = req.request_id
        if rid in self._scheduled_ids or rid in self._preempted_ids:
            return False
        if rid in self.in_flight_ids:
            return False
        return req.status != _SWAPPED or rid in self._swapped_in_ids

    def can_schedule(self, req: Request, num_tokens: int) -> bool:
        if num_tokens < 1 or num_tokens > req.num_uncomputed_tokens:
            return False
        if self.seq_budget < 1 or num_tokens > self.token_budget:
            return False
        if not self._is_schedulable(req):
            return False
        need = self.blocks_needed(req, num_tokens)
        return need <= self.num_free_blocks - self._admission_reserve(req)

    def max_schedulable_tokens(self, req: Request) -> int:
        """The largest chunk of `req` that fits the budgets and free blocks (0 if none)."""
        if self.seq_budget < 1 or not self._is_schedulable(req):
            return 0
        held = self.num_blocks_of(req) if req.status in (_RUNNING, _SWAPPED) else 0
        free = self.num_free_blocks - self._admission_reserve(req)
        capacity = (held + max(0, free)) * self._block_size - req.num_computed_tokens
        return max(0, min(req.num_uncomputed_tokens, self.token_budget, capacity))

    def can_preempt(self, req: Request, mode: PreemptionMode) -> bool:
        rid = req.request_id
        if req.status != _RUNNING or rid in self._scheduled_ids or rid in self._preempted_ids:
            return False
        if rid in self.in_flight_ids:
            return False
        if mode == PreemptionMode.SWAP:
            return self.num_blocks_of(req) <= self.num_free_host_blocks
        return True

    def can_swap_in(self, req: Request) -> bool:
        if req.status != _SWAPPED or req.request_id in self._swapped_in_ids:
            return False
        return self.num_blocks_of(req) <= self.num_free_blocks

    # ---- decisions ------------------------------------------------------------------
    def restrict_token_budget(self, max_tokens: int) -> None:
        """Tighten this step's token budget (chunked-prefill policies)."""
        self.token_budget = min(self.token_budget, max_tokens)

    def can_reserve_prefill(self, req: Request) -> bool:
        """Would the request's whole remaining prefill fit in free blocks (with watermark)?"""
        need = self.blocks_needed(req, req.num_uncomputed_tokens)
        return need <= self.num_free_blocks - self._admission_reserve(req)

    def schedule(self, req: Request, num_tokens: int) -> None:
        if not self.can_schedule(req, num_tokens):
            raise ValueError(f"cannot schedule {num_tokens} tokens of {req.request_id!r}")
        self.num_free_blocks -= self.blocks_needed(req, num_tokens)
        if req.status in _HOLDS_NO_KV:
            self.num_active_seqs += 1
        self.token_budget -= num_tokens
        self.seq_budget -= 1
        self._scheduled_ids.add(req.request_id)
        self.scheduled.append(req)
        self.num_scheduled_tokens.append(num_tokens)

    def schedule_decode(self, req: Request) -> bool:
        """Fast path: one token for a running request if it fits; True if scheduled."""
        return self.schedule_decodes([req], 0) == 1

    def schedule_decodes(self, order: list[Request], start: int = 0) -> int:
        """Fast path: one token for each running, decoding request of `order[start:]`, in
        order; returns the index of the first one it did not schedule (len if none)."""
        scheduled_ids, preempted_ids, in_flight = (
            self._scheduled_ids, self._preempted_ids, self.in_flight_ids
        )
        block_size, blocks_of = self._block_size, self._kv.num_device_blocks_of
        append_req, append_n = self.scheduled.append, self.num_scheduled_tokens.append
        for index in range(start, len(order)):
            req = order[index]
            rid = req.request_id
            if self.seq_budget < 1 or self.token_budget < 1 or req.status != _RUNNING:
                return index
            if rid in scheduled_ids or rid in preempted_ids or rid in in_flight:
                return index
            computed = req.num_computed_tokens
            if req.num_tokens - computed != 1:
                return index
            need = -(-(computed + 1) // block_size) - blocks_of(rid)
            if need > self.num_free_blocks:
                return index
            if need > 0:
                self.num_free_blocks -= need
            self.token_budget -= 1
            self.seq_budget -= 1
            scheduled_ids.add(rid)
            append_req(req)
            append_n(1)
        return len(order)

    def preempt(self, req: Request, mode: PreemptionMode) -> None:
        if not self.can_preempt(req, mode):
            raise ValueError(f"cannot preempt {req.request_id!r} by {mode.name}")
        blocks = self.num_blocks_of(req)
        self.num_free_blocks += blocks
        if mode == PreemptionMode.SWAP:
            self.num_free_host_blocks -= blocks
        self.num_active_seqs -= 1
        self._preempted_ids.add(req.request_id)
        self.preemptions.append((req, mode))

    def swap_in(self, req: Request) -> None:
        if not self.can_swap_in(req):
            raise ValueError(f"cannot swap in {req.request_id!r}")
        self.num_free_blocks -= self.num_blocks_of(req)
        # Host blocks are released only after the step's swap-outs: no credit here.
        self._swapped_in_ids.add(req.request_id)
        self.num_active_seqs += 1
        self.swap_ins.append(req)

    def preemption_mode_for(self, req: Request) -> PreemptionMode:
        """The configured mode, falling back to recompute when the host tier is full."""
        mode = self.config.preemption_mode
        if mode == PreemptionMode.SWAP and self.num_blocks_of(req) > self.num_free_host_blocks:
            return PreemptionMode.RECOMPUTE
        return mode

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled or self.preemptions or self.swap_ins)
