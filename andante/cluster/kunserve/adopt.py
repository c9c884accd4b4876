"""Moving a member's requests into its pipeline group's leader (KunServe §4.2).

Design note: when instances merge into a pipeline group (`GroupPlan`), the group has one
scheduler and one block manager: the leader's, whose device tier was grown by the
dropped weights (`KVBlockManager.resize_device`). A block id of that manager names one
slot on every member, each member holding the KV of its own layer slice there. This
module moves each merging engine's requests into the leader's scheduler, at a step
boundary, with no executor in sight:

- waiting and preempted requests are re-queued at the leader (nothing to move);
- swapped requests lose their host KV and are re-queued for recompute (the paper's
  groups serve from device memory only);
- running requests keep their progress (computed tokens, output, timeline) and get a
  new block table in the leader's manager; the KV of each layer must then reach the
  member that now holds that layer. `kv_moves` lists those copies, as
  (request, src member, src block, dst member, dst block, layer range), for the
  executor to carry out in chunks, activations first (`kv_mode="exchange"`); with
  `kv_mode="recompute"` (or when the leader has no room) the request is preempted by
  recompute instead and re-prefills at the leader.

The source of a request's KV is described by the layout it was computed under (a
`GroupPlan`: an ungrouped instance is a one-member plan over every layer), so merging
groups into a bigger group uses the same code. The leader's own requests are "adopted"
with their table unchanged: only the layers the leader drops move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from andante.cluster.kunserve.seam import GroupPlan, KVMode
from andante.core.request import Request, RequestStatus
from andante.engine.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class KVMove:
    """Copy the KV of layers [layers[0], layers[1]) of one block."""

    request_id: str
    src_member: int
    src_block: int
    dst_member: int
    dst_block: int
    layers: tuple[int, int]

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(slots=True)
class Adoption:
    """What moving the requests did (request lists hold the leader's new requests)."""

    requeued: list[Request] = field(default_factory=list)  # waiting / preempted (queued)
    adopted: list[Request] = field(default_factory=list)  # running, progress kept
    recomputed: list[Request] = field(default_factory=list)  # running/swapped, KV dropped
    moves: list[KVMove] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return len(self.requeued) + len(self.adopted) + len(self.recomputed)

    def num_layer_blocks_moved(self) -> int:
        """Block-layers to copy (a move of k layers counts k)."""
        return sum(m.num_layers for m in self.moves)

    def extend(self, other: Adoption) -> None:
        self.requeued += other.requeued
        self.adopted += other.adopted
        self.recomputed += other.recomputed
        self.moves += other.moves


def whole_model(index: int, num_layers: int) -> GroupPlan:
    """The layout of an ungrouped instance: one member holding every layer."""
    return GroupPlan((index,), ((0, num_layers),))


def kv_moves(request_id: str, src: GroupPlan, src_table: Sequence[int],
             dst: GroupPlan, dst_table: Sequence[int]) -> list[KVMove]:
    """The copies that take a request's KV from layout `src` (blocks `src_table`) to
    layout `dst` (blocks `dst_table`); a slot already in place is not copied."""
    if src.num_layers != dst.num_layers:
        raise ValueError(f"layouts cover {src.num_layers} and {dst.num_layers} layers")
    if len(src_table) != len(dst_table):
        raise ValueError(f"{request_id!r}: {len(src_table)} source blocks, "
                         f"{len(dst_table)} destination blocks")
    moves: list[KVMove] = []
    for dst_member, (d_start, d_end) in zip(dst.members, dst.layer_slices, strict=True):
        for src_member, (s_start, s_end) in zip(src.members, src.layer_slices, strict=True):
            start, end = max(d_start, s_start), min(d_end, s_end)
            if start >= end:
                continue
            for src_block, dst_block in zip(src_table, dst_table, strict=True):
                if src_member == dst_member and src_block == dst_block:
                    continue
                moves.append(KVMove(request_id, src_member, src_block, dst_member,
                                    dst_block, (start, end)))
    return moves


def adopt_into_leader(source: Scheduler, src_layout: GroupPlan, leader: Scheduler,
                      plan: GroupPlan, kv_mode: KVMode | None = None) -> Adoption:
    """Move every request of `source` (an engine serving under `src_layout`) into the
    `leader`'s scheduler of the group `plan`. `source` may be the leader itself: its
    requests stay, only the KV of the layers it drops moves (or is recomputed).
    Raises ValueError if `source` has a batch in flight (call it at a step boundary)."""
    if source.has_in_flight:
        raise ValueError("adopt requests only at a step boundary (a batch is in flight)")
    mode = plan.kv_mode if kv_mode is None else kv_mode
    result = Adoption()
    now = source.clock.now()
    for request_id in list(source.requests):
        src_table = list(source.kv.block_table(request_id))
        req = source.detach(request_id)
        if req is None:  # (not reached: nothing is in flight)
            continue
        if req.status == RequestStatus.RUNNING and mode == "exchange" and src_table:
            table = leader.adopt(req)
            if table is not None:
                result.adopted.append(req)
                result.moves += kv_moves(request_id, src_layout, src_table, plan, table)
                continue
        if req.status in (RequestStatus.RUNNING, RequestStatus.SWAPPED):
            req.preempt_by_recompute(now)
            result.recomputed.append(req)
        else:
            result.requeued.append(req)
        leader.adopt(req)
    return result


def adopt_group(sources: Sequence[tuple[Scheduler, GroupPlan]], leader: Scheduler,
                plan: GroupPlan, kv_mode: KVMode | None = None) -> Adoption:
    """Form `plan`'s group: the leader's own requests first (their tables stay and
    keep their blocks), then each other source's. `sources` lists every engine that
    served before (ungrouped members and former groups' leaders) with its layout."""
    result = Adoption()
    ordered = sorted(sources, key=lambda s: s[0] is not leader)
    for scheduler, layout in ordered:
        if scheduler is leader:
            result.extend(_keep_leader_requests(leader, layout, plan, kv_mode))
        else:
            result.extend(adopt_into_leader(scheduler, layout, leader, plan, kv_mode))
    return result


def _keep_leader_requests(leader: Scheduler, layout: GroupPlan, plan: GroupPlan,
                          kv_mode: KVMode | None) -> Adoption:
    """The leader's own requests: tables unchanged; the layers it drops move to their
    new holder (exchange) or the running requests are recomputed."""
    if leader.has_in_flight:
        raise ValueError("adopt requests only at a step boundary (a batch is in flight)")
    mode = plan.kv_mode if kv_mode is None else kv_mode
    result = Adoption(requeued=list(leader.waiting))  # they stay queued
    now = leader.clock.now()
    for req in list(leader.running) + list(leader.swapped):
        rid = req.request_id
        table = list(leader.kv.block_table(rid))
        if req.status == RequestStatus.RUNNING and mode == "exchange":
            result.adopted.append(req)
            result.moves += kv_moves(rid, layout, table, plan, table)
            continue
        leader.detach(rid)
        req.preempt_by_recompute(now)
        leader.adopt(req)
        result.recomputed.append(req)
    return result
