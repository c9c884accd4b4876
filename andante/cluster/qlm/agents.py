"""QLM agents: each instance's virtual queue turned into serving operations (QLM §5).

Design note. "A QLM agent resident on each LLM serving instance monitors the virtual
queue ordering and converts it into LSO actions" (§5, Fig. 7). Per instance, from the head
of its virtual queue, the agent asks for:
- a model swap (LSO 5) when the head group's model is not on the device, once the
  instance has drained, or at once when the head group cannot wait for the drain (late
  groups included: the head is never starved) and is due before every request the swap
  would flush (otherwise those come back to the head and swap the model back), with
  hysteresis; while it drains for a swap, it pulls the device model's later requests
  expected to finish within the drain;
- a warm start of the next cold model in the queue (LSO 5);
- request pulling (LSO 1) while the instance has spare KV tokens and no backlog of its own,
  bounded (where another instance serves the same model) by one step's prompt tokens
  (`pull_tokens`): an addition to the paper's pull by free capacity, which let one
  instance take 59 requests in one dispatch at 64 req/s on W_B (`pull_room`);
- when the head group changes and does not fit, request eviction or GPU-CPU state swap
  (LSOs 2-3) of running requests due after it, each by cost (andante.cluster.qlm
  .eviction), and the head group pulled into the room they free (the instance's
  `qlm-edf` policy never preempts for a waiting request by itself). The router
(andante.cluster.qlm.router) builds the virtual queues and records what was placed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from andante.cluster.instance import ModelState
from andante.cluster.qlm.estimator import OutputLengthModel, RCTEstimator
from andante.cluster.qlm.eviction import Evictions, RunningRequest, head_group_evictions
from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.types import InstanceView as QLMView
from andante.cluster.qlm.virtual_queue import VirtualQueue, model_actions, pull_requests
from andante.cluster.router import InstanceView, QueueDecision
from andante.core.request import PreemptionMode
from andante.engine.stats import SchedulerStats

log = logging.getLogger(__name__)
EVICTION_SAMPLES = 10  # S of the head group's expected completion (eq. 5)


def reported_backlog(stats: SchedulerStats) -> int | None:
    """The prompt tokens an instance holds not yet prefilled (its unprefilled tokens less
    each running decode's next one), or None where it does not report token counts: an
    engine counts at least each unfinished request's next token, while an upstream
    server's stats (andante.runtime.upstream.instance) leave the count at 0."""
    if stats.num_uncomputed_tokens < stats.num_requests:
        return None
    return max(0, stats.num_uncomputed_tokens - stats.num_running)


class ModelView(InstanceView, Protocol):
    """A router's view of an instance (the controller's slot) that can report models."""

    @property
    def multi_model(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """One switch per operation (the ablation) and the swap and pull knobs:
    `pull_reserve`: KV tokens a pulled request reserves for its output, in mean outputs
    of its group; `swap_hysteresis`: a model swap before the instance drains needs the
    device model to have served this many times its own load time; `pull_tokens`: the
    prompt tokens an instance may hold that it has not yet prefilled, what it pulls
    included (one step's token budget: the engines' max_num_batched_tokens, 8,192 by
    default), so that it pulls only what it can start at its next step."""

    pull: bool = True
    warm_start: bool = True
    pull_reserve: float = 1.0
    pull_tokens: int = 8192  # prompt tokens an instance holds not yet prefilled (`pull_room`)
    swap_hysteresis: float = 2.0
    evict: bool = True  # LSO 2: make room for a new head group
    state_swap: bool = True  # LSO 3: swap a victim's KV to host memory where it pays

    def __post_init__(self) -> None:
        if self.pull_tokens < 1:
            raise ValueError(f"qlm: pull_tokens must be >= 1, got {self.pull_tokens!r}")


@dataclass(frozen=True, slots=True)
class AgentInstance:
    """One instance as its agent sees it at a dispatch."""

    slot: ModelView  # the controller's slot: load report, models, requests in transit
    state: ModelState
    view: QLMView  # the estimator's view of it
    drain_s: float  # its own drain-time prediction at its learned speed
    deadlines: Mapping[str, float]  # of the requests placed on it, by request id
    running: tuple[RunningRequest, ...] = ()  # of those, the ones running now


def load_time(state: ModelState, model: str) -> float:
    """Seconds to load `model`: from host memory (warm), else from disk too (cold)."""
    size = state.weight_bytes.get(model, 0)
    warm = size / state.host_link_bandwidth
    return warm if model in state.host else warm + size / state.disk_bandwidth


class QLMAgents:
    """The agents of every instance; they remember each instance's last model swap."""

    def __init__(self, options: AgentOptions, outputs: OutputLengthModel) -> None:
        self.options = options
        self.outputs = outputs  # the router's output-length model (learned as it serves)
        self.last_swap: dict[int, tuple[float, float]] = {}  # instance -> (when, load s)
        self.last_head: dict[int, str] = {}  # instance -> its virtual queue's head group
        self.head_outcomes: Counter[str] = Counter()  # eviction checks, by outcome

    def act(self, queues: Mapping[int, list[RequestGroup]],
            instances: Sequence[AgentInstance], estimator: RCTEstimator,
            now: float, moved: frozenset[str] = frozenset()) -> QueueDecision:
        """The placements, model swaps and warm starts every agent asks for now; a
        head group in `moved` (re-balanced to this instance from another one, not put
        at its head by a plan) evicts nothing for being the new head."""
        placements: list[tuple[str, int]] = []
        swaps: list[tuple[int, str]] = []
        warm: list[tuple[int, str]] = []
        evictions: list[tuple[int, str, PreemptionMode]] = []
        for inst in instances:
            index, queue, state = inst.slot.index, queues[inst.slot.index], inst.state
            if not queue:
                continue
            vq = VirtualQueue(inst.view.instance_id, tuple(g.group_id for g in queue))
            by_id = {g.group_id: g for g in queue}
            actions = model_actions(vq, by_id, inst.view, dict(state.weight_bytes))
            if self.options.warm_start and actions.warm_start is not None:
                warm.append((index, actions.warm_start))
            qview = inst.view
            if actions.swap_to is not None:
                if not self.should_swap(inst, queue[0], now):
                    placements += [(rid, index) for rid in self.fill_drain(
                        inst, vq, by_id, estimator)]
                    continue
                swaps.append((index, actions.swap_to))
                log.info("qlm: instance %d swaps %s -> %s at %.2f s (head group deadline "
                         "in %.2f s, drain %.2f s)", index, state.device,
                         actions.swap_to, now, queue[0].deadline - now, inst.drain_s)
                self.last_swap[index] = (now, load_time(state, actions.swap_to))
                qview = dataclasses.replace(qview, models_on_device=(actions.swap_to,),
                                            num_running_tokens=0)  # its KV is flushed
            elif self.head_changed(index, queue[0]) and queue[0].group_id not in moved:
                evicted = self.evict_for_head(inst, queue[0], estimator, now)
                self.head_outcomes[evicted.outcome] += 1
                if evicted.victims:
                    evictions += [(index, rid, mode) for rid, mode in evicted.victims]
                    placements += [(rid, index) for rid in self.pulled_after(
                        inst, queue[0], evicted)]
                    continue
            shared = sum(1 for other in instances
                         if other.state.device == qview.models_on_device[0]) > 1
            placements += [(rid, index) for rid in self.pulled(inst, vq, by_id, qview,
                                                                   shared)]
        return QueueDecision(tuple(placements), tuple(swaps), tuple(warm), tuple(evictions))

    def head_changed(self, index: int, head: RequestGroup) -> bool:
        """Is `head` a new head of instance `index`'s virtual queue (§5: the trigger
        of eviction and state swap)?"""
        changed = self.last_head.get(index) != head.group_id
        self.last_head[index] = head.group_id
        return changed

    def evict_for_head(self, inst: AgentInstance, head: RequestGroup,
                       estimator: RCTEstimator, now: float) -> Evictions:
        """LSOs 2-3: the running requests to remove for the head group (none when it
        fits or can wait for the room, or without eviction: the ablation). The head's
        expected completion is the estimator's (eq. 5, its mean over S samples)."""
        if not self.options.evict or not inst.running or inst.state.loading_s > 0:
            return Evictions(outcome="off" if not self.options.evict else "not_running")
        stats = inst.slot.load.stats
        block = inst.state.block_size
        samples = estimator.group_times(inst.view, head, EVICTION_SAMPLES,
                                        np.random.default_rng(0))
        return head_group_evictions(
            head, inst.running, inst.view.spare_tokens,
            max(0, stats.max_num_seqs - stats.num_running),
            int(self.options.pull_reserve * self.outputs.mean(head.key)),
            inst.state.costs[inst.state.device], stats.num_free_host_blocks * block,
            self.options.state_swap, now=now,
            head_time_s=float(np.mean(samples.completion)))

    def pulled_after(self, inst: AgentInstance, head: RequestGroup,
                     evicted: Evictions) -> tuple[str, ...]:
        """The head group's requests that fit in the room the evictions free."""
        stats = inst.slot.load.stats
        qview = dataclasses.replace(inst.view, num_running_tokens=max(
            0, inst.view.num_running_tokens - evicted.freed_tokens))
        vq = VirtualQueue(inst.view.instance_id, (head.group_id,))
        reserve = int(self.options.pull_reserve * self.outputs.mean(head.key))
        room = max(0, stats.max_num_seqs - stats.num_running) + len(evicted.victims)
        return pull_requests(vq, {head.group_id: head}, qview, reserve)[:room]

    def should_swap(self, inst: AgentInstance, head: RequestGroup, now: float) -> bool:
        """Swap once the instance has drained, or at once when the head group cannot
        wait for the running batch: its slack is shorter than the (learned) drain time,
        whether it can still meet its deadline after the load or is late already (the
        head of the queue is never starved), provided that it is more urgent than every
        request the swap would flush (EDF: otherwise those come back to the head of the
        queue and swap the model back: ping-pong), that the drain would take longer than
        the load itself, and that the model on the device has served at least
        `swap_hysteresis` times as long as it took to load."""
        if inst.state.loading_s > 0:
            return False
        load = inst.slot.load
        drained = load.stats.num_running + load.stats.num_waiting == 0 \
            and inst.slot.num_in_transit == 0
        if drained:
            return True
        since, cost = self.last_swap.get(inst.slot.index, (-math.inf, 0.0))
        drain = inst.drain_s
        more_urgent = head.deadline < min(inst.deadlines.values(), default=math.inf)
        return (more_urgent and head.deadline - now < drain
                and load_time(inst.state, head.model) < drain
                and now - since >= self.options.swap_hysteresis * cost)

    def pull_room(self, slot: ModelView, flushed: bool = False) -> tuple[int, int]:
        """(requests, prompt tokens) an instance can pull now (LSO 1): what it can start
        at its next step. Its free batch slots, its own backlog (waiting, swapped out)
        counted as taken, and `pull_tokens` less the prompt tokens it holds not yet
        prefilled; nothing while requests are in transit to it. `flushed`: a model
        swap empties it. (Without the bound, an instance with no backlog took every
        request that fit its 256 slots at once: at 64 req/s on W_B one instance pulled
        59 requests in one dispatch, ended with 102 against the other's 58, and
        finished 4 s after it.)"""
        stats = slot.load.stats
        if flushed:
            return max(0, stats.max_num_seqs), self.options.pull_tokens
        if slot.num_in_transit:
            return 0, 0
        backlog = reported_backlog(stats)
        if backlog is None:  # no token counts (an upstream server): any wait is a backlog
            if stats.num_waiting:
                return 0, 0
            backlog = 0
        tokens = self.options.pull_tokens - backlog
        seqs = max(0, stats.max_num_seqs - stats.num_requests)
        return (seqs, tokens) if tokens > 0 and seqs > 0 else (0, 0)

    def pulled(self, inst: AgentInstance, vq: VirtualQueue, by_id: dict[str, RequestGroup],
               qview: QLMView, shared: bool = True) -> tuple[str, ...]:
        """Request pulling (LSO 1): into spare KV tokens, what the instance can start at
        its next step (`pull_room`); without pulling (ablation) every request of the
        instance's device-model groups at once. The prompt-token bound keeps the work
        of a model balanced over the instances serving it (`shared`: another instance
        has the model on its device); an instance alone with its model takes all it
        has room for, so that it serves its model's queue before a model swap (Insight
        #3: with the bound there too, W_A at 9 req/s made 24 swaps instead of 16 and
        its throughput fell from 1.73 to 1.24 req/s)."""
        if not self.options.pull:
            return tuple(rid for g in vq.groups(by_id) if g.model in qview.models_on_device
                         for rid in g.request_ids)
        flushed = qview.models_on_device[0] != inst.slot.multi_model.model_state().device
        room, tokens = self.pull_room(inst.slot, flushed)
        if not room:
            return ()
        head = vq.groups(by_id)[0]
        reserve = int(self.options.pull_reserve * self.outputs.mean(head.key))
        return pull_requests(vq, by_id, qview, reserve, tokens if shared else None)[:room]

    def fill_drain(self, inst: AgentInstance, vq: VirtualQueue,
                   by_id: dict[str, RequestGroup], estimator: RCTEstimator
                   ) -> tuple[str, ...]:
        """While the instance drains its device model before a swap to the head group's,
        pull (LSO 1) from the later groups of the device model the requests expected to
        finish within the drain (prefill plus their group's mean output at the learned
        speed), so the batch's free slots do not idle and the swap is not delayed."""
        if not self.options.pull:
            return ()
        qview = inst.view
        iid, device = qview.instance_id, qview.models_on_device[0]
        fitting = []
        for group in vq.groups(by_id)[1:]:
            if group.model != device:
                continue
            prompt = max(group.prompt_tokens)
            step = estimator.cost.decode_time(iid, device, qview.avg_batch_size, prompt)
            expected = (estimator.cost.prefill_time(iid, device, prompt)
                        + step * self.outputs.mean(group.key))
            if expected <= inst.drain_s:
                fitting.append(group.group_id)
        if not fitting:
            return ()
        return self.pulled(inst, VirtualQueue(vq.instance_id, tuple(fitting)), by_id, qview)
