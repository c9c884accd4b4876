"""`--router kunserve`: KunServe's global dispatcher plus its coordinator's settings.

Design note (KunServe §3, Figure 4): "our dispatcher incorporates the load-balancing
design from Llumnix". A request goes to a serving unit (a group's leader stands for its
group; members are not alive to routers while grouped) that would start it at its next
step (`can_take_now`): nothing queued or in transit ahead of it, a sequence slot free
and Llumnix's freeness above 0 (andante.cluster.llumnix's F = (free blocks - queued
demand) / running requests, the requests in transit counted as running ones holding the
unit's mean blocks per request); among those, and among the others when none can, the
least-loaded's expected wait (andante.cluster.router: predicted drain time).
Not the drain time alone: after a restore the leader keeps every request of its group,
whose remaining decodes make its drain time long (~40 s in the quick experiment) while
it has memory and sequence slots to spare; by drain time every arrival went to the
emptied members, which queued 100+ requests on their own sequence budget while the
leader admitted none (the long run's P50 TTFT rose 53% with restore on). Not freeness
alone either: it ignores the prefill queue, and under compute-bound load (long prompts,
memory to spare) it gave P99 TTFT 6.9 s against least-loaded's 4.4 s
(tests/sim/test_kunserve_sustained.py); ordering by prompt tokens queued ahead instead
filled units until memory ran out and made groups flap there (5 drops, 3 restores).
The coordinator (`KunServeCoordinator`) does the rest. The router carries the
coordinator's options so that `andante simulate --router kunserve --router-option
KEY=VALUE` reaches them: the paper's thresholds (`drop_threshold` on projected demand,
`restore_threshold` 0.5), the KV mode, the inter-instance link, and the ablation
switches (`drop`, `coordinated`, `lookahead`, `restore`, `seq_scale`: a group's
sequence budget scaled by its KV blocks per member, andante.cluster.kunserve.lookahead's
`group_config`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from andante.cluster.kunserve.monitor import MonitorOptions
from andante.cluster.llumnix import freeness
from andante.cluster.router import InstanceView, LeastLoadedRouter, expected_wait
from andante.core.request import Request

KV_MODES = ("exchange", "recompute", "auto")


@dataclass(frozen=True, slots=True)
class KunServeSettings:
    monitor: MonitorOptions = MonitorOptions()
    kv_mode: str = "auto"
    link: str = "rdma-200g"
    drop: bool = True
    coordinated: bool = True
    lookahead: bool = True
    restore: bool = True
    seq_scale: bool = True  # a group's sequence budget follows its KV (ablation switch)
    max_members: int | None = None

    def __post_init__(self) -> None:
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {KV_MODES}, got {self.kv_mode!r}")
        if self.max_members is not None and self.max_members < 2:
            raise ValueError(f"max_members must be >= 2, got {self.max_members}")


_MONITOR_KEYS = {f.name for f in fields(MonitorOptions)}
_BOOL_KEYS = ("drop", "coordinated", "lookahead", "restore", "seq_scale")


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"router kunserve: {key} must be true or false, got {value!r}")
    return text in ("true", "1", "yes")


def settings_from(options: dict[str, Any]) -> KunServeSettings:
    """Parse `--router-option` values (strings or typed values)."""
    monitor: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in options.items():
        if key in _MONITOR_KEYS:
            kind = int if key in ("decode_tokens", "scale_up_checks",
                                  "queue_horizon_tokens") else float
            monitor[key] = kind(value)
        elif key in _BOOL_KEYS:
            own[key] = _as_bool(key, value)
        elif key in ("kv_mode", "link"):
            own[key] = str(value)
        elif key == "max_members":
            own[key] = int(value)
        else:
            known = sorted(_MONITOR_KEYS | set(_BOOL_KEYS) | {"kv_mode", "link", "max_members"})
            raise ValueError(f"router kunserve: unknown option {key!r}; known: "
                             f"{', '.join(known)}")
    return KunServeSettings(MonitorOptions(**monitor), **own)


class KunServeRouter(LeastLoadedRouter):
    name = "kunserve"

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.settings = settings_from(options)

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        if not alive:
            return None
        return min(alive, key=dispatch_key).index


def dispatch_freeness(view: InstanceView) -> float:
    """Llumnix's freeness of a serving unit with its requests in transit counted as
    running ones holding its mean blocks per request (see the module note)."""
    return freeness(view.load.stats, view.num_in_transit)


def can_take_now(view: InstanceView) -> bool:
    """Would a request sent now start at the unit's next step: nothing queued or in
    transit ahead of it, memory (freeness above 0) and a sequence slot free?"""
    stats = view.load.stats
    if stats.num_waiting or view.num_in_transit > 0:
        return False
    return dispatch_freeness(view) > 0 and (stats.max_num_seqs <= 0
                                            or stats.num_running < stats.max_num_seqs)


def dispatch_key(view: InstanceView) -> tuple[bool, float, int, int]:
    """Smallest first (see the module note): cannot start it now; expected wait;
    requests; index."""
    requests = view.load.stats.num_requests + max(0, view.num_in_transit)
    return not can_take_now(view), expected_wait(view), requests, view.index
