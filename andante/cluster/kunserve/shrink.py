"""KunServe's "shrink by one": a pipeline group lets its last member go when the
pressure falls but not enough to restore every member (§4.1: the fewer instances a
group holds, the less its pipeline costs, Figure 5; §4.4: restore once memory allows).

Design note. A group of three or more members whose projected KV demand (the monitor's
`projected_demand`: blocks in use, the queue within its horizon, the running requests'
growth) would fill at most `restore_threshold` (the paper's 50%) of the group without
its last member (`shrunk`: members[:-1], layers re-balanced, its block count from
`LayerMemory.group_blocks`) releases that member: it reloads its dropped layers and
serves alone, the others take its layers back. The last member goes first because it
joined last (a grow appends, `plan.merged`), so the leader and the requests it holds
stay. The condition must hold for `restore_window_seconds` in a row, as a restore's does
(the next burst of a clump likely needs the memory again), and the group must have
lived `min_group_seconds`; a group of two restores whole instead (the restore rule).
The decision is pure (`shrink_fits`, `ShrinkWatch`): the coordinator asks it for every
group on both clocks and the `PipelineGroups` carry a shrink out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.cluster.kunserve.monitor import MonitorOptions, projected_demand
from andante.cluster.kunserve.plan import LayerMemory, balanced_slices
from andante.cluster.kunserve.seam import GroupPlan
from andante.engine.stats import SchedulerStats


def shrunk(plan: GroupPlan) -> GroupPlan | None:
    """`plan` without its last member, the layers balanced over the rest (None: fewer
    than three members, a shrink would be a restore)."""
    if len(plan.members) < 3:
        return None
    members = plan.members[:-1]
    return GroupPlan(members, balanced_slices(len(members), plan.num_layers), plan.kv_mode)


def shrink_fits(plan: GroupPlan, stats: SchedulerStats, memory: LayerMemory,
                block_size: int, options: MonitorOptions) -> bool:
    """Would the group without its last member hold its projected demand within
    `restore_threshold` of its blocks, with nothing waiting for memory beyond it?"""
    smaller = shrunk(plan)
    if smaller is None:
        return False
    demand = projected_demand(stats, block_size, options.decode_tokens,
                              options.queue_horizon_tokens)
    return demand <= options.restore_threshold * memory.group_blocks(smaller)


@dataclass(slots=True)
class ShrinkWatch:
    """Since when each group (by leader) could have shrunk, and when it formed."""

    fits_since: dict[int, float] = field(default_factory=dict)
    formed_at: dict[int, float] = field(default_factory=dict)

    def due(self, plan: GroupPlan, fits: bool, now: float, options: MonitorOptions) -> bool:
        """Should the group shrink now (`fits` held for the restore window, the group
        lived `min_group_seconds`)? Updates the watch."""
        formed = self.formed_at.setdefault(plan.leader, now)
        if not fits:
            self.fits_since.pop(plan.leader, None)
            return False
        since = self.fits_since.setdefault(plan.leader, now)
        return (now - formed >= options.min_group_seconds
                and now - since >= options.restore_window_seconds)

    def forget(self, leader: int) -> None:
        """The group changed (formed, grew, shrank or restored): start over."""
        self.fits_since.pop(leader, None)
        self.formed_at.pop(leader, None)
