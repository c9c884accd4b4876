"""Virtual queues and the LSO decisions that follow from them (QLM §4-5).

Design note. Each instance has one virtual queue (Def. 4.2): an ordering of request-group
ids that references requests held in the global queue, never copies of them. The QLM
agent on each instance turns the ordering into LSO actions (§5, Fig. 7); here each action
is a pure decision function:
- request pulling (LSO 1): while the running batch's tokens are below capacity, pull
  requests from the head group in FCFS order; continue into the following groups only
  while they need no model swap;
- model swap and warm start (LSO 5): the head group's model must be active (on device);
  the first later group whose model is neither on the device nor in host memory names the
  model to load into host memory ahead of need;
- request eviction vs GPU-CPU state swap (LSOs 2-3) when the head group changes,
  decided per request by cost as in Insight #2 (§2.4): swapping costs the KV bytes over
  the host link (the device->host copy is asynchronous and hidden, §5, so the cost on
  the critical path is the copy back), eviction costs re-prefilling prompt + generated
  tokens on this model and hardware. Insight #2 weighs the host memory a swap holds
  per KV token against the recompute time per token: a swap's full price per KV byte is
  its two copies over the host link (out, overlapped, and back) plus what the byte is
  worth in host memory, which is a real budget (it needs room there) whose bytes could
  otherwise keep model weights warm, each saving 1 / disk bandwidth seconds at a model
  swap (LSO 5). A request is swapped when recomputing it costs more than that: on an
  A100, Mistral-7B's small (GQA) KV is swapped and Vicuna-13B's 6x larger KV evicted, as
  the paper finds (Fig. 4).
Load balancing (LSO 4) is the planner's assignment of groups to queues (§5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.types import InstanceView, check_non_negative, check_positive
from andante.core.request import PreemptionMode


@dataclass(frozen=True, slots=True)
class VirtualQueue:
    """The ordered group ids one instance serves next (head first)."""

    instance_id: str
    group_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(set(self.group_ids)) != len(self.group_ids):
            raise ValueError(f"duplicate group ids in virtual queue: {self.group_ids!r}")

    @property
    def head(self) -> str | None:
        return self.group_ids[0] if self.group_ids else None

    def without(self, group_ids: Sequence[str]) -> VirtualQueue:
        drop = set(group_ids)
        return VirtualQueue(self.instance_id, tuple(g for g in self.group_ids if g not in drop))

    def groups(self, by_id: Mapping[str, RequestGroup]) -> list[RequestGroup]:
        """The queue's groups still present in `by_id` (finished groups are skipped)."""
        return [by_id[g] for g in self.group_ids if g in by_id]


def pull_requests(queue: VirtualQueue, by_id: Mapping[str, RequestGroup], view: InstanceView,
                  reserve_output_tokens: int = 0,
                  prompt_budget: int | None = None) -> tuple[str, ...]:
    """Request ids to move into the running batch now (LSO 1, pull-based).

    Each request needs its prompt plus `reserve_output_tokens` tokens of capacity; pulling
    stops at the first request that does not fit (FCFS, no skipping) and at the first group
    whose model is not active on the device (that needs a model swap first).
    `prompt_budget` (None: no bound) bounds the prompt tokens pulled to what the instance
    can start soon; the first request is pulled whatever its prompt, so a prompt longer
    than the budget is never stranded.
    """
    if reserve_output_tokens < 0:
        raise ValueError(f"reserve_output_tokens must be >= 0, got {reserve_output_tokens!r}")
    if prompt_budget is not None and prompt_budget < 0:
        raise ValueError(f"prompt_budget must be >= 0, got {prompt_budget!r}")
    spare = view.spare_tokens
    budget = math.inf if prompt_budget is None else prompt_budget
    pulled: list[str] = []
    for group in queue.groups(by_id):
        if group.model not in view.models_on_device:
            break
        for rid, prompt in zip(group.request_ids, group.prompt_tokens, strict=True):
            need = prompt + reserve_output_tokens
            if need > spare or (prompt > budget and pulled):
                return tuple(pulled)
            spare -= need
            budget -= prompt
            pulled.append(rid)
    return tuple(pulled)


@dataclass(frozen=True, slots=True)
class ModelActions:
    """What the head of the queue asks of the instance's model tiers."""

    swap_to: str | None  # the head group's model when it is not on the device
    warm_start: str | None  # the next model to load into host memory ahead of need


def model_actions(queue: VirtualQueue, by_id: Mapping[str, RequestGroup], view: InstanceView,
                  model_bytes: Mapping[str, int] | None = None) -> ModelActions:
    """Model swap for the head group and warm start for the next cold model (§5 LSO 5).

    Warm models fill host memory in queue order "until all the CPU memory is exhausted"
    (§5): with `model_bytes` and a known `view.host_memory_bytes`, the warm-start
    candidate is the first cold model that fits in the host memory left.
    """
    groups = queue.groups(by_id)
    if not groups:
        return ModelActions(None, None)
    head_model = groups[0].model
    swap_to = None if head_model in view.models_on_device else head_model
    free = None
    if model_bytes is not None and view.host_memory_bytes is not None:
        free = view.host_memory_bytes - sum(model_bytes.get(m, 0) for m in view.models_on_host)
    warm = next((g.model for g in groups[1:]
                 if g.model != head_model and view.tier(g.model) == "disk"
                 and (free is None or model_bytes is None
                      or model_bytes.get(g.model, 0) <= free)), None)
    return ModelActions(swap_to, warm)


@dataclass(frozen=True, slots=True)
class PreemptionChoice:
    """Eviction (recompute) or GPU-CPU state swap for one running request, with both costs."""

    mode: PreemptionMode
    swap_cost_s: float
    recompute_cost_s: float


def choose_preemption(num_context_tokens: int, kv_bytes_per_token: float,
                      host_link_bandwidth: float, prefill_time: Callable[[int], float],
                      host_free_bytes: float | None = None,
                      host_byte_value_s: float = 0.0) -> PreemptionChoice:
    """Insight #2: swap when recomputing costs more than the swap's two copies and the
    host memory it holds (see the module note); `swap_cost_s` is the copy back, the one
    on the critical path.

    `prefill_time(n)` is the time to prefill n tokens on this model and hardware (e.g.
    `CostModel.prefill_time`); `host_free_bytes` (None: unlimited) bounds the swap;
    `host_byte_value_s`: seconds a byte of host memory saves used otherwise (1 / disk
    bandwidth: warm weights; 0: host memory is free).
    """
    check_non_negative("host_byte_value_s", host_byte_value_s)
    if num_context_tokens < 0:
        raise ValueError(f"num_context_tokens must be >= 0, got {num_context_tokens!r}")
    check_positive("kv_bytes_per_token", kv_bytes_per_token)
    check_positive("host_link_bandwidth", host_link_bandwidth)
    kv_bytes = num_context_tokens * kv_bytes_per_token
    swap_cost = kv_bytes / host_link_bandwidth
    recompute_cost = prefill_time(num_context_tokens) if num_context_tokens else 0.0
    check_non_negative("prefill_time", recompute_cost)
    fits = host_free_bytes is None or kv_bytes <= host_free_bytes
    price = kv_bytes * (2.0 / host_link_bandwidth + host_byte_value_s)
    worth = recompute_cost > price
    mode = PreemptionMode.SWAP if fits and worth else PreemptionMode.RECOMPUTE
    return PreemptionChoice(mode, swap_cost, recompute_cost)


def head_change_preemptions(running_context_tokens: Mapping[str, int], kv_bytes_per_token: float,
                            host_link_bandwidth: float, prefill_time: Callable[[int], float],
                            host_free_bytes: float | None = None) -> dict[str, PreemptionChoice]:
    """Per running request, eviction or state swap when a new head group takes the batch
    (LSOs 2-3); swaps are granted in order while host memory lasts."""
    free = host_free_bytes
    choices: dict[str, PreemptionChoice] = {}
    for rid, tokens in running_context_tokens.items():
        choice = choose_preemption(tokens, kv_bytes_per_token, host_link_bandwidth,
                                   prefill_time, free)
        if choice.mode is PreemptionMode.SWAP and free is not None:
            free -= tokens * kv_bytes_per_token
        choices[rid] = choice
    return choices
