"""KunServe's monitor: throttling on projected KV demand, restore and scale-up (§3, §4.4).

Design note. An instance (or a pipeline group, through its leader) is throttled when
requests queue for KV memory: the blocks in use, plus the blocks the queued work needs
(`SchedulerStats.num_queued_kv_blocks`), plus the growth of the running requests over
the next `decode_tokens` tokens each, exceed `threshold` x its blocks, while some
request waits. The excess is its unmet demand, the R of the paper's Figure 6. Using
projected demand, not only current use, lets the plan act before the queue builds
("has suffered or is about to suffer", §1).

Only the queue's first `queue_horizon_tokens` tokens count as demand: prompts further
back wait for prefill compute before they wait for memory, and a queue of long prompts
under sustained load would otherwise read as memory pressure however much memory is
free, and form groups that only cost compute (issue 30 item 6).

Restore (§4.4): a group restores when its KV usage, measured against one instance
without drop (the leader keeps every request after the restore), is at most
`restore_threshold` (the paper: 50%) and not rising, with nothing queued, and the group
has lived `min_group_seconds` (no drop/restore flapping within one burst). Under
sustained load that never happens, so a group also restores when the memory its drop
freed has been idle for `idle_restore_seconds`: its blocks in use fit `restore_fit` of
its members' pools without drop (a queue may wait: for compute, not memory). Then memory does not
bind, and the group only pays its pipeline's bubbles and hops; the members, restored,
serve the same work with their own memory, and join no group for a back-off that
doubles with each such restore in a row (the coordinator's `_back_off`).
Either restore also waits until the dropped memory has lain idle for
`restore_window_seconds` (hysteresis; 0 turns it off): bursts come in clumps (BurstGPT's
gaps have a CV of 2), and a group restored in a lull between two clumps drops again,
late, when the next one arrives; what the recent peak needed, the next clump likely
needs too. The default, 60 s, is about one burst of the quick experiment (30% of a
180 s cycle); there it took the flapping variant of the ablation (recompute,
uncoordinated, no lookahead) from 5 drops and 5 restores to 1 and 1 (P99 TTFT 250 s to
47 s) and left the other runs' percentiles as they were.
Scale-up (§4.4 "Autoscaling"): after a drop, a unit whose usage keeps rising for
`scale_up_checks` consecutive checks while throttled, or a throttle that no plan can
relieve, raises the signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.engine.stats import SchedulerStats


@dataclass(frozen=True, slots=True)
class MonitorOptions:
    drop_threshold: float = 1.0  # projected demand / blocks above which a unit throttles
    decode_tokens: int = 16  # projected growth of each running request, tokens
    restore_threshold: float = 0.5  # usage (vs one undropped instance) to restore at
    min_group_seconds: float = 2.0
    scale_up_checks: int = 20
    check_interval: float = 0.05  # seconds between checks (engine clock)
    queue_horizon_tokens: int = 16384  # queued tokens counted as demand (0: all)
    restore_fit: float = 0.9  # idle-memory restore: demand / members' undropped blocks
    idle_backoff_seconds: float = 10.0  # no group for a while after an idle restore
    idle_restore_seconds: float = 10.0  # dropped memory idle this long: restore
    restore_window_seconds: float = 60.0  # either restore: dropped memory idle this long

    def __post_init__(self) -> None:
        if self.drop_threshold <= 0:
            raise ValueError(f"drop_threshold must be > 0, got {self.drop_threshold}")
        if not 0 < self.restore_threshold < 1:
            raise ValueError(f"restore_threshold must be in (0, 1), got "
                             f"{self.restore_threshold}")
        if self.decode_tokens < 0 or self.scale_up_checks < 1:
            raise ValueError("decode_tokens must be >= 0 and scale_up_checks >= 1")
        if self.min_group_seconds < 0 or self.check_interval < 0:
            raise ValueError("min_group_seconds and check_interval must be >= 0")
        if self.queue_horizon_tokens < 0 or not 0 < self.restore_fit <= 1 \
                or self.idle_backoff_seconds < 0 or self.idle_restore_seconds < 0 \
                or self.restore_window_seconds < 0:
            raise ValueError("queue_horizon_tokens and idle_*_seconds must be >= 0 "
                             "and restore_fit in (0, 1]")


def queued_demand(stats: SchedulerStats, block_size: int, horizon_tokens: int) -> int:
    """Blocks of the queued work within the horizon (0: no cap)."""
    if horizon_tokens <= 0:
        return stats.num_queued_kv_blocks
    return min(stats.num_queued_kv_blocks, -(-horizon_tokens // block_size))


def projected_demand(stats: SchedulerStats, block_size: int, decode_tokens: int,
                     horizon_tokens: int = 0) -> int:
    """Blocks the unit would hold once its queue (within `horizon_tokens`) is admitted
    and its running requests grew by `decode_tokens` tokens each."""
    used = stats.num_blocks - stats.num_free_blocks
    growth = -(-stats.num_running * decode_tokens // block_size)
    return used + queued_demand(stats, block_size, horizon_tokens) + growth


def unmet_demand(stats: SchedulerStats, block_size: int, options: MonitorOptions) -> int:
    """Blocks of projected demand beyond the threshold (0: not throttled)."""
    if stats.num_waiting == 0:
        return 0
    demand = projected_demand(stats, block_size, options.decode_tokens,
                              options.queue_horizon_tokens)
    return max(0, demand - int(options.drop_threshold * stats.num_blocks))


@dataclass(slots=True)
class GroupWatch:
    """What the monitor remembers of one group since it formed."""

    formed_at: float
    last_usage: float = 1.0
    num_rising: int = 0
    signalled: bool = False
    idle_since: float | None = None  # the dropped memory unused since then
    idle_rule: bool = False  # the last restore found due was the idle-memory rule's

    def observe(self, usage: float) -> bool:
        """Record a usage; True if it rose since the previous check."""
        rising = usage > self.last_usage
        self.num_rising = self.num_rising + 1 if rising else 0
        self.last_usage = usage
        return rising


@dataclass(slots=True)
class Watches:
    groups: dict[int, GroupWatch] = field(default_factory=dict)  # by leader

    def restore_due(self, leader: int, stats: SchedulerStats, base_blocks: int, now: float,
                    options: MonitorOptions, num_members: int = 1, block_size: int = 1
                    ) -> bool:
        """Should the group of `num_members` led by `leader` restore now (the paper's
        rule, or its dropped memory idle; module note)? (Updates its watch.)"""
        watch = self.groups.setdefault(leader, GroupWatch(formed_at=now))
        used = stats.num_blocks - stats.num_free_blocks
        usage = used / base_blocks if base_blocks else 1.0
        rising = watch.observe(usage)
        if used > options.restore_fit * num_members * base_blocks:
            watch.idle_since = None
        elif watch.idle_since is None:
            watch.idle_since = now
        if now - watch.formed_at < options.min_group_seconds:
            return False
        idle_for = -1.0 if watch.idle_since is None else now - watch.idle_since
        if options.restore_window_seconds and idle_for < options.restore_window_seconds:
            return False  # the recent peak needed the dropped memory: the next may too
        idle_queue = stats.num_waiting == 0 and stats.num_queued_kv_blocks == 0
        if usage <= options.restore_threshold and not rising and idle_queue:
            watch.idle_rule = False  # the paper's rule: a restore after real use
            return True
        watch.idle_rule = num_members > 1 and idle_for >= options.idle_restore_seconds
        return watch.idle_rule

    def idle_memory(self, leader: int) -> bool:
        """Was the group's restore due to its dropped memory lying idle (the idle rule,
        not the paper's usage rule, which the restore window also lets fire only once the
        memory has lain idle)?"""
        watch = self.groups.get(leader)
        return watch is not None and watch.idle_rule

    def keeps_rising(self, leader: int, options: MonitorOptions) -> bool:
        """Has the group's usage risen for `scale_up_checks` checks (signalled once)?"""
        watch = self.groups.get(leader)
        if watch is None or watch.signalled or watch.num_rising < options.scale_up_checks:
            return False
        watch.signalled = True
        return True
