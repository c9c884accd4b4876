"""`--router kunserve`: KunServe's global dispatcher plus its coordinator's settings.

Design note (KunServe §3, Figure 4): "our dispatcher incorporates the load-balancing
design from Llumnix": a request goes to the serving unit with the most *freeness*
(andante.cluster.llumnix's F = (free blocks - queued demand) / running requests), a
group's leader standing for its group (members are not alive to routers while grouped).
Requests sent but not yet taken in (`num_in_transit`) count as running requests holding
the unit's mean blocks per request, so that an arrival burst between two load reports
does not all go to one unit (the herd Llumnix's freeness alone would cause). Freeness,
not the predicted drain time of andante.cluster.router's least-loaded: after a restore
the leader keeps every request of its group, whose remaining decodes make its drain time
long (~40 s in the quick experiment) while it has memory and sequence slots to spare; by
drain time every arrival went to the emptied members, which queued 100+ requests on
their own sequence budget while the leader admitted none (the long run's P50 TTFT rose
53% with restore on). The coordinator (`KunServeCoordinator`) does the rest. The router carries the
coordinator's options so that `andante simulate --router kunserve --router-option
KEY=VALUE` reaches them: the paper's thresholds (`drop_threshold` on projected demand,
`restore_threshold` 0.5), the KV mode, the inter-instance link, and the ablation
switches (`drop`, `coordinated`, `lookahead`, `restore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from andante.cluster.kunserve.monitor import MonitorOptions
from andante.cluster.router import InstanceView, LeastLoadedRouter
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
    max_members: int | None = None

    def __post_init__(self) -> None:
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {KV_MODES}, got {self.kv_mode!r}")
        if self.max_members is not None and self.max_members < 2:
            raise ValueError(f"max_members must be >= 2, got {self.max_members}")


_MONITOR_KEYS = {f.name for f in fields(MonitorOptions)}
_BOOL_KEYS = ("drop", "coordinated", "lookahead", "restore")


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
        return max(alive, key=_dispatch_key).index if alive else None


def dispatch_freeness(view: InstanceView) -> float:
    """Llumnix's freeness of a serving unit with its requests in transit counted as
    running ones holding its mean blocks per request (see the module note)."""
    stats = view.load.stats
    transit = max(0, view.num_in_transit)
    used = stats.num_blocks - stats.num_free_blocks
    per_request = used / stats.num_running if stats.num_running else 0.0
    left = stats.num_free_blocks - stats.num_queued_kv_blocks - transit * per_request
    return left / max(1, stats.num_running + transit)


def _dispatch_key(view: InstanceView) -> tuple[float, int, int]:
    """Most free first; ties: fewer requests, then the lower index."""
    requests = view.load.stats.num_requests + view.num_in_transit
    return (dispatch_freeness(view), -requests, -view.index)
