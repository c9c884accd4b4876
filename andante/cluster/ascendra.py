"""`ascendra` router: the controller side of Ascendra's LP and HP instance pools.

Design note (Ascendra §4 and §6.1). New requests go to the low-priority (LP) pool, round
robin within it. An HP instance with nothing to do asks for work with a ticket: while it
holds one, the next new request goes to it instead. A ticket is granted only when the
HP instance has nothing pending (no prefill waiting or under way — Fig. 7: "when there
are no pending prefills" — and no request in transit to it), runs fewer
than half of `capacity` requests and has more than `free_kv_share` of its KV cache
free; at most one is outstanding per HP instance, because a request routed by a ticket
stays in transit (then waiting) until the instance reports it, and no ticket is granted
meanwhile. Requests an LP instance hands back (offloads of at-risk prompts, §5.3) go to
the HP instance with the shortest queue. Instances are told apart by their role, "lp" or
"hp"; the ones without a role count as LP. `pool_plan` is the one statement of which
instance is LP or HP and what it runs, for the simulator and the server alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from andante.cluster.registry import PoolMember
from andante.cluster.router import InstanceView, _RouterBase
from andante.core.request import Request

LP, HP = "lp", "hp"
HP_BATCH_FACTOR = 4  # the HP pool's elastic batch: 4x the LP batch cap


def pool_plan(num_instances: int, num_hp: int,
              policy_options: Mapping[str, Any] | None = None) -> list[PoolMember]:
    """The LP pool first, then the last `num_hp` instances as HP. `policy_options`
    keys start with "lp." or "hp." and reach that pool's policy."""
    if not 1 <= num_hp < num_instances:
        raise ValueError(f"router 'ascendra' needs 1 <= hp_instances < instances, got "
                         f"{num_hp} of {num_instances}")
    pools: dict[str, dict[str, Any]] = {LP: {}, HP: {}}
    for key, value in (policy_options or {}).items():
        pool, _, name = key.partition(".")
        if pool not in pools or not name:
            raise ValueError(f"router 'ascendra': policy option {key!r} must start with "
                             "'lp.' or 'hp.'")
        pools[pool][name] = value
    lp = PoolMember(LP, "ascendra-lp", pools[LP])
    hp = PoolMember(HP, "ascendra-hp", pools[HP], HP_BATCH_FACTOR)
    return [lp] * (num_instances - num_hp) + [hp] * num_hp


class AscendraRouter(_RouterBase):
    name = "ascendra"

    def __init__(self, capacity: int = 128, free_kv_share: float = 0.10,
                 tickets: bool = True, **options: Any) -> None:
        super().__init__(**options)
        if capacity < 1 or not 0 <= free_kv_share < 1:
            raise ValueError(f"router 'ascendra': bad capacity={capacity!r} or "
                             f"free_kv_share={free_kv_share!r}")
        self.capacity = capacity
        self.free_kv_share = free_kv_share
        self.tickets = tickets
        self._next_lp = 0
        self.num_ticketed = 0
        self.num_offloads = 0

    def has_ticket(self, view: InstanceView) -> bool:
        """§6.1: an idle HP instance's ticket."""
        if view.role != HP or not view.alive or view.num_in_transit:
            return False
        load = view.load
        return (load.num_prefilling == 0 and 2 * load.stats.num_running < self.capacity
                and load.stats.kv_usage < 1.0 - self.free_kv_share)

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        if self.tickets:
            for view in instances:
                if self.has_ticket(view):
                    self.num_ticketed += 1
                    return view.index
        lps = [v for v in instances if v.role != HP and v.alive]
        if not lps:  # no LP left: the HP pool serves everything
            hps = [v for v in instances if v.alive]
            return self._shortest_queue(hps)
        view = lps[self._next_lp % len(lps)]
        self._next_lp += 1
        return view.index

    def place_handoff(
        self, req: Request, source: int, instances: Sequence[InstanceView]
    ) -> int | None:
        hps = [v for v in instances if v.role == HP and v.alive and v.index != source]
        if not hps:  # nowhere to offload: it stays where it was
            return source if instances[source].alive else self.route(req, instances)
        self.num_offloads += 1
        return self._shortest_queue(hps)

    @staticmethod
    def _shortest_queue(views: Sequence[InstanceView]) -> int | None:
        if not views:
            return None
        best = min(views, key=lambda v: (v.load.stats.num_waiting + v.num_in_transit, v.index))
        return best.index
