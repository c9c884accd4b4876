"""KunServe's KV exchange: which bytes cross which link, in which order (§4.2).

Design note. When a group forms, each running request's KV for the layers a member
dropped must reach the member now holding them (the block moves come from
andante.cluster.kunserve.adopt); when it restores, the KV comes back to the leader. The
paper's coordinated exchange sends KV in chunks sized like one pipeline stage's work and
checks for activation transfers after each chunk, sending those first; a request stays
out of the schedules until its last chunk has arrived (the paper's stall), the others
keep running. This module is that schedule, once for both clocks:
- `ExchangeQueue`: the moves grouped per (request, source, destination, layer run), in
  request order, cut into chunks of at most `chunk_blocks` blocks, handed out between
  the leader's steps up to a byte budget (the runtime copies them: andante.runtime.
  kunserve_exchange); a request gone meanwhile (finished, aborted) loses its chunks;
- `link_load`: the bytes each member sends and receives (the simulator's exchange
  occupies the link for the busiest member's bytes);
- `cheaper_kv_mode`: exchange the running requests' KV, or recompute them at the leader
  when re-prefilling costs less than moving it.
Moves within one member (its new block ids) are copied the same way but cross no link.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from andante.cluster.kunserve.adopt import KVMove
from andante.cluster.kunserve.seam import KVMode
from andante.perf.cost_model import CostModel
from andante.perf.links import LinkSpec


@dataclass(slots=True)
class Chunk:
    """Copy layers [layers[0], layers[1]) of `src_blocks` on member `src_member` into
    `dst_blocks` on member `dst_member`, for one request."""

    request_id: str
    src_member: int
    dst_member: int
    layers: tuple[int, int]
    src_blocks: list[int] = field(default_factory=list)
    dst_blocks: list[int] = field(default_factory=list)

    @property
    def local(self) -> bool:
        """Within one member: crosses no link."""
        return self.src_member == self.dst_member


def chunks(moves: Iterable[KVMove], chunk_blocks: int) -> list[Chunk]:
    """Moves grouped per (request, source, destination, layers), in request order, cut
    into chunks of at most `chunk_blocks` blocks."""
    runs: dict[tuple[str, int, int, tuple[int, int]], Chunk] = {}
    for m in moves:
        key = (m.request_id, m.src_member, m.dst_member, m.layers)
        run = runs.get(key)
        if run is None:
            run = runs[key] = Chunk(m.request_id, m.src_member, m.dst_member, m.layers)
        run.src_blocks.append(m.src_block)
        run.dst_blocks.append(m.dst_block)
    return [Chunk(run.request_id, run.src_member, run.dst_member, run.layers,
                  run.src_blocks[i:i + chunk_blocks], run.dst_blocks[i:i + chunk_blocks])
            for run in runs.values() for i in range(0, len(run.src_blocks), chunk_blocks)]


class ExchangeQueue:
    """The chunks of one exchange still to copy, in order (see the module note)."""

    def __init__(self, moves: Iterable[KVMove], chunk_blocks: int = 16) -> None:
        if chunk_blocks < 1:
            raise ValueError(f"chunk_blocks must be >= 1, got {chunk_blocks}")
        self._queue = deque(chunks(moves, chunk_blocks))
        self._left = Counter(c.request_id for c in self._queue)

    @property
    def done(self) -> bool:
        return not self._queue

    def pending_ids(self) -> list[str]:
        """The requests whose KV has not all arrived (held out of the schedules)."""
        return list(self._left)

    def run(self, budget_bytes: int | None, is_live: Callable[[str], bool],
            copy: Callable[[Chunk], int]) -> list[str]:
        """`copy` chunks in order until `budget_bytes` are spent (None: all; at least one
        chunk either way); a request that `is_live` says is gone loses its chunks.
        Returns the requests whose KV is now complete."""
        spent = 0
        complete: list[str] = []
        while self._queue and (budget_bytes is None or spent < budget_bytes or not spent):
            chunk = self._queue.popleft()
            rid = chunk.request_id
            if is_live(rid):
                spent += copy(chunk)
            self._left[rid] -= 1
            if not self._left[rid]:
                del self._left[rid]
                if is_live(rid):
                    complete.append(rid)
        return complete


@dataclass(frozen=True, slots=True)
class LinkLoad:
    """What an exchange puts on the links: bytes sent in all, and the busiest member's
    bytes (sent or received: each member has its own link)."""

    bytes_sent: int
    busiest_bytes: int


def link_load(moves: Iterable[KVMove], block_bytes_per_layer: int) -> LinkLoad:
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for move in moves:
        size = move.num_layers * block_bytes_per_layer
        if move.src_member != move.dst_member:
            sent[move.src_member] = sent.get(move.src_member, 0) + size
            received[move.dst_member] = received.get(move.dst_member, 0) + size
    return LinkLoad(sum(sent.values()), max([*sent.values(), *received.values(), 0]))


def cheaper_kv_mode(num_tokens: int, num_members: int, cost: CostModel,
                    link: LinkSpec) -> KVMode:
    """Exchange the running requests' KV (`num_tokens` of it over the group's members)
    unless re-prefilling it at the leader costs less (per 8192-token prefill)."""
    moved = num_tokens * cost.kv_bytes_per_token_per_gpu * (1 - 1 / num_members)
    exchange = link.transfer_time(moved)
    return "exchange" if exchange <= cost.prefill_time(min(num_tokens, 8192)) * max(
        1, num_tokens / 8192) else "recompute"
