"""KunServe's drop plan: which groups merge into pipelines to free memory (§4.1, Fig. 6).

Design note. Upon throttling, the coordinator computes the KV demand R of the queued
requests that the free blocks cannot hold. Every serving unit is a pipeline group (an
ungrouped instance is a group of one member holding every layer). The greedy algorithm
of the paper's Figure 6 pops the groups with the fewest members first (a min-heap on
group size: fewer pipeline stages cost less, its Figure 5), merges two of them into a
new group whose members each keep a contiguous, balanced slice of the layers (two
singletons: each drops half; two pairs: each member drops half of what it held; a
formed group keeps its leader when a smaller unit joins it, `merged`), adds
the freed memory, and repeats until the freed memory covers R or no two groups are left
(then no plan satisfies R: the caller signals scale-up). Among groups of equal size the
most pressed (largest unmet demand) go first, so the throttled instances are the ones
that gain memory. It runs in O(N log N) for N groups.

Memory arithmetic (homogeneous instances, `LayerMemory`): a member holding l of the L
layers has its KV region plus the weights of the L - l dropped layers for KV, and one
block of the group stores block_size tokens of l layers there. The group's block count
is the smallest over its members (one block manager, the same block id on every member).
Embedding and LM head stay on every member (conservative).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from andante.cluster.kunserve.seam import GroupPlan
from andante.perf.cost_model import CostModel


@dataclass(frozen=True, slots=True)
class LayerMemory:
    """One instance's memory in the units the plan needs (bytes per device/instance)."""

    num_layers: int
    weight_bytes_per_layer: int
    kv_block_bytes_per_layer: int  # one block (block_size tokens) of one layer's KV
    kv_region_bytes: int  # the KV cache of an instance holding every layer

    def __post_init__(self) -> None:
        for name in ("num_layers", "weight_bytes_per_layer", "kv_block_bytes_per_layer",
                     "kv_region_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LayerMemory.{name} must be positive, got "
                                 f"{getattr(self, name)}")

    @property
    def num_blocks_whole(self) -> int:
        """Blocks of an instance holding every layer."""
        return self.member_blocks(self.num_layers)

    def member_blocks(self, num_layers_held: int) -> int:
        """Blocks a member holding `num_layers_held` layers can store."""
        dropped = self.num_layers - num_layers_held
        memory = self.kv_region_bytes + dropped * self.weight_bytes_per_layer
        return memory // (self.kv_block_bytes_per_layer * num_layers_held)

    def group_blocks(self, plan: GroupPlan) -> int:
        """The group's block count: the smallest over its members."""
        return min(self.member_blocks(end - start) for start, end in plan.layer_slices)

    def dropped_weight_bytes(self, plan: GroupPlan) -> int:
        """Weights the members of `plan` dropped (what a restore reloads)."""
        held = sum(end - start for start, end in plan.layer_slices)
        return (len(plan.members) * self.num_layers - held) * self.weight_bytes_per_layer

    def reload_bytes(self, plan: GroupPlan) -> int:
        """The weight bytes of the member that dropped the most layers (§4.4: what its
        restore reloads; the members reload in parallel)."""
        return max((self.num_layers - (end - start)) * self.weight_bytes_per_layer
                   for start, end in plan.layer_slices)


def layer_memory(cost: CostModel, num_blocks: int, block_size: int) -> LayerMemory:
    """One instance's memory per GPU, from its cost model and its KV pool of
    `num_blocks` blocks (each tp rank drops its shard of a layer)."""
    model = cost.model
    per_layer = (model.dense_params_per_layer + 2 * model.hidden_size) * model.dtype_bytes
    kv_token = cost.kv_bytes_per_token_per_gpu
    return LayerMemory(
        num_layers=model.num_layers,
        weight_bytes_per_layer=per_layer // cost.tp,
        kv_block_bytes_per_layer=block_size * kv_token // model.num_layers,
        kv_region_bytes=num_blocks * block_size * kv_token,
    )


def balanced_slices(num_members: int, num_layers: int) -> tuple[tuple[int, int], ...]:
    """Contiguous slices of `num_layers` layers, sizes differing by at most one."""
    if not 1 <= num_members <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers over {num_members} members")
    base, extra = divmod(num_layers, num_members)
    slices, start = [], 0
    for k in range(num_members):
        end = start + base + (1 if k < extra else 0)
        slices.append((start, end))
        start = end
    return tuple(slices)


def merged(first: GroupPlan, second: GroupPlan, num_layers: int) -> GroupPlan:
    """The group of both groups' members, balanced slices. The unit with more members
    keeps leading, its members first (a solo joining a formed group is appended: the
    group's requests stay where they run and its stages keep their order; the grow of
    andante.exec.torch_regroup); of two equal units, `first`'s leader leads."""
    lead, other = (second, first) if len(second.members) > len(first.members) \
        else (first, second)
    members = lead.members + other.members
    return GroupPlan(members, balanced_slices(len(members), num_layers), first.kv_mode)


@dataclass(frozen=True, slots=True)
class GroupState:
    """A serving unit as the plan sees it: its layout and its unmet demand (blocks)."""

    plan: GroupPlan
    pressure: int = 0


@dataclass(frozen=True, slots=True)
class DropPlan:
    """Groups to form (each replaces the groups whose members it holds)."""

    groups: tuple[GroupPlan, ...]
    demand_blocks: int
    freed_blocks: int

    @property
    def satisfied(self) -> bool:
        return self.freed_blocks >= self.demand_blocks


def drop_plan(units: Sequence[GroupState], demand_blocks: int, memory: LayerMemory,
              max_members: int | None = None) -> DropPlan:
    """Figure 6's greedy plan freeing `demand_blocks` blocks (see the module note).
    `max_members` caps a group's size (default: one layer per member at most)."""
    limit = min(max_members or memory.num_layers, memory.num_layers)
    heap = [(len(u.plan.members), -u.pressure, u.plan.leader, u.plan) for u in units]
    heapq.heapify(heap)
    formed: dict[int, GroupPlan] = {}  # leader -> group formed by this plan
    freed = 0
    while freed < demand_blocks and len(heap) >= 2:
        size_a, press_a, _, first = heapq.heappop(heap)
        size_b, press_b, _, second = heapq.heappop(heap)
        if size_a + size_b > limit:  # the smallest pair is too big: so is every other
            break
        group = merged(first, second, memory.num_layers)
        freed += (memory.group_blocks(group) - memory.group_blocks(first)
                  - memory.group_blocks(second))
        formed.pop(first.leader, None)
        formed.pop(second.leader, None)
        formed[group.leader] = group
        heapq.heappush(heap, (size_a + size_b, press_a + press_b, group.leader, group))
    return DropPlan(tuple(formed.values()), demand_blocks, freed)
