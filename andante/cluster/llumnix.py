"""`--router llumnix`: Llumnix's dispatch and migration decisions (OSDI'24 §4.4).

Design note (Llumnix §4.4.2-§4.4.3, as KunServe §2.3/§5.1 uses it as a baseline: "load
balancing to cope with memory throttling of an instance, and migrates KVCache between
instances"). Llumnix ranks instances by *freeness*, F = (M - ΣV) / B: the KV blocks
left once every request's *virtual usage* is counted (running requests: their blocks;
queued requests: the blocks they need, so that an instance whose queue is blocked on
memory looks overloaded, the "de-fragmentation" of §4.4.2), per request of its batch B:
how many more blocks each running request may grow before memory runs out.
- dispatch: least-loaded (andante.cluster.router, which counts the requests still in
  transit; Llumnix's freeness does not, and would send a whole arrival burst to one
  instance between two load reports);
- migration, checked every `check_interval` seconds: instances whose freeness is below
  `out_threshold` are sources, those above `in_threshold` destinations; the least free
  source pairs with the freest destination while the pair's freeness differs by at
  least `gap` (`migration_pairs`); a source sends the running request holding the fewest
  blocks that fits the destination (`pick_running`: the cheapest to copy, Llumnix's
  short-request-first choice), its KV copied over the inter-instance link, which frees
  room for its blocked queue; with none fitting, a queued request that never ran.
These are decisions only: the simulated cluster carries them out
(andante.sim.llumnix), the same functions deciding for any cluster that can move KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from andante.cluster.router import LeastLoadedRouter
from andante.engine.stats import SchedulerStats


def freeness(stats: SchedulerStats, in_transit: int = 0) -> float:
    """Llumnix's F: blocks left after virtual usage, per running request (a queue that
    does not fit makes it negative). Requests `in_transit` (sent, not yet received)
    count as running ones holding the mean blocks of those running."""
    transit = max(0, in_transit)
    used = stats.num_blocks - stats.num_free_blocks
    per_request = used / stats.num_running if stats.num_running else 0.0
    left = stats.num_free_blocks - stats.num_queued_kv_blocks - transit * per_request
    return left / max(1, stats.num_running + transit)


@dataclass(frozen=True, slots=True)
class MigrationPair:
    source: int
    destination: int


def migration_pairs(loads: Sequence[tuple[int, SchedulerStats]], out_threshold: float,
                    in_threshold: float, gap: float) -> list[MigrationPair]:
    """Pairs (least free source, freest destination), each instance in one pair at most
    (see the module note)."""
    ranked = sorted(loads, key=lambda item: freeness(item[1]))
    sources = [i for i, s in ranked if freeness(s) < out_threshold]
    targets = [i for i, s in reversed(ranked) if freeness(s) > in_threshold]
    by_index = dict(loads)
    pairs: list[MigrationPair] = []
    for src, dst in zip(sources, targets, strict=False):
        if src == dst or freeness(by_index[dst]) - freeness(by_index[src]) < gap:
            break
        pairs.append(MigrationPair(src, dst))
    return pairs


def pick_running(candidates: Sequence[tuple[str, int]], free_blocks: int,
                 reserve_blocks: int = 0) -> str | None:
    """The running request holding the fewest blocks that fits `free_blocks` at the
    destination with `reserve_blocks` to spare; None if none fits."""
    fitting = [(blocks, rid) for rid, blocks in candidates
               if blocks + reserve_blocks <= free_blocks]
    return min(fitting)[1] if fitting else None


class LlumnixRouter(LeastLoadedRouter):
    """Least-loaded dispatch; carries the migration options."""

    name = "llumnix"

    def __init__(self, out_threshold: float = 1.0, in_threshold: float = 4.0,
                 gap: float = 2.0, link: str = "rdma-200g", check_interval: float = 0.05,
                 **options: Any) -> None:
        super().__init__(**options)
        self.out_threshold, self.in_threshold = float(out_threshold), float(in_threshold)
        self.gap = float(gap)
        if self.gap <= 0 or self.in_threshold < self.out_threshold:
            raise ValueError("router llumnix: need gap > 0 and in_threshold >= "
                             f"out_threshold, got gap={gap}, out_threshold={out_threshold},"
                             f" in_threshold={in_threshold}")
        self.link = str(link)
        self.check_interval = float(check_interval)
        if self.check_interval < 0:
            raise ValueError(f"router llumnix: check_interval must be >= 0, got "
                             f"{check_interval}")
