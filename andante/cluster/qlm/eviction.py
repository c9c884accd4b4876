"""Request eviction and GPU-CPU state swap for a new head group (QLM §5, LSOs 2-3).

Design note. "When the head request group changes, the QLM agent initiates request
eviction or GPU-CPU state swap" (§5): running requests are removed from the batch to
make room for the incoming head group. `head_group_evictions` is that decision for one
instance: if the head group's requests (prompt plus the output they reserve, one batch
slot each) do not fit in the instance's spare KV tokens and free slots, and the head
group cannot wait for the running requests to free that room (each finishes after its
own expected output, the learned mean of its group's key: the estimate the groups use,
not an instance-wide prior) and still meet its deadline, it removes running requests
whose deadlines are later than the head group's and that can afford the wait (each
still meets its deadline after the head group's expected completion and its own
remaining work: no churn among near-equal deadlines, where a victim would become the
next late head), latest first, until the head fits (none at all if even every such
request would not make room); each one is
evicted (recompute) or swapped to host memory per request by Insight #2
(andante.cluster.qlm.virtual_queue.choose_preemption: its transfer and recompute times
and the host memory it would hold, host memory a budget that swaps use up).
`preemption_chooser` is the same per-request rule for the preemptions the engine makes
itself (its running batch outgrowing the KV cache). One code path for both clocks: the
agents (andante.cluster.qlm.agents) call it from the router, which the simulator and the
server drive alike; the instances apply the result (`Instance.evict`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.virtual_queue import choose_preemption
from andante.core.request import PreemptionMode, Request
from andante.perf.cost_model import CostModel


@dataclass(frozen=True, slots=True)
class RunningRequest:
    """A request running on an instance, as its agent sees it."""

    request_id: str
    deadline: float
    num_kv_tokens: int  # its KV on the device (prompt and output computed so far)
    remaining_s: float = 0.0  # expected seconds to finish: its own expected output left


def preemption_mode(cost: CostModel, num_kv_tokens: int,
                    host_free_tokens: float | None = None) -> PreemptionMode:
    """Eviction or state swap of one request of `num_kv_tokens` on this model and
    hardware (Insight #2, module note of andante.cluster.qlm.virtual_queue)."""
    per_token = cost.model.kv_bytes_per_token / cost.tp  # each GPU's share, own link
    free = None if host_free_tokens is None else host_free_tokens * per_token
    return choose_preemption(num_kv_tokens, per_token, cost.hardware.host_link_bandwidth,
                             cost.prefill_time, free,
                             1.0 / cost.hardware.disk_bandwidth).mode


def preemption_chooser(cost: CostModel) -> Callable[[Request], PreemptionMode]:
    """Each victim's mode by its own KV (the engine's `preemption_mode_of`; the host
    tier's room is the engine's to check)."""

    def mode_of(req: Request) -> PreemptionMode:
        return preemption_mode(cost, req.num_computed_tokens)

    return mode_of


@dataclass(frozen=True, slots=True)
class Evictions:
    """What the agent removes from the batch for the head group: (request id, mode)
    pairs, and the KV tokens and batch slots they free."""

    victims: tuple[tuple[str, PreemptionMode], ...] = ()
    freed_tokens: int = 0
    outcome: str = "evicted"  # else why none: fits, waits, no_victim, no_room (module note)

    @property
    def num_swaps(self) -> int:
        return sum(1 for _, mode in self.victims if mode is PreemptionMode.SWAP)


def room_wait_s(running: Sequence[RunningRequest], need_tokens: int, members: int,
                spare_tokens: int, free_slots: int) -> float:
    """Seconds until the running requests, finishing in order of their expected
    remaining time, free `need_tokens` KV tokens and `members` batch slots (the whole
    drain if even all of them would not)."""
    freed, slots, wait = 0, 0, 0.0
    for req in sorted(running, key=lambda r: (r.remaining_s, r.request_id)):
        if spare_tokens + freed >= need_tokens and free_slots + slots >= members:
            return wait
        freed, slots, wait = freed + req.num_kv_tokens, slots + 1, max(wait, req.remaining_s)
    return wait


def head_group_evictions(head: RequestGroup, running: Sequence[RunningRequest],
                         spare_tokens: int, free_slots: int, reserve_tokens: int,
                         cost: CostModel, host_free_tokens: float, state_swap: bool = True,
                         *, now: float, head_time_s: float) -> Evictions:
    """The running requests to remove so the head group fits (module note); the head
    group's expected completion once it starts is `head_time_s`."""
    members = len(head.request_ids)
    need = sum(head.prompt_tokens) + reserve_tokens * members
    if need <= spare_tokens and members <= free_slots:
        return Evictions(outcome="fits")
    wait = room_wait_s(running, need, members, spare_tokens, free_slots)
    if now + wait + head_time_s <= head.deadline:
        return Evictions(outcome="waits")  # it can wait for the room, still in time
    later = sorted((r for r in running if r.deadline > head.deadline
                    and now + head_time_s + r.remaining_s <= r.deadline),
                   key=lambda r: (-r.deadline, r.request_id))
    if not later:
        return Evictions(outcome="no_victim")
    need = min(need, spare_tokens + sum(r.num_kv_tokens for r in later))
    victims: list[tuple[str, PreemptionMode]] = []
    freed, host = 0, host_free_tokens
    for req in later:
        if spare_tokens + freed >= need and free_slots + len(victims) >= members:
            break
        mode = preemption_mode(cost, req.num_kv_tokens, host) if state_swap \
            else PreemptionMode.RECOMPUTE
        if mode is PreemptionMode.SWAP:
            host -= req.num_kv_tokens
        victims.append((req.request_id, mode))
        freed += req.num_kv_tokens
    if spare_tokens + freed < head.prompt_tokens[0] + reserve_tokens:
        return Evictions(outcome="no_room")  # not even the head's first request fits
    return Evictions(tuple(victims), freed)
