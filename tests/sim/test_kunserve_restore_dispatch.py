"""After a restore the leader keeps every request of its group (KunServe §4.4), among them
long decodes, and the members come back empty: the two instances' predicted drain times
then say little about where a new request starts sooner (by drain time alone 98 of the
next 100 arrivals went to one instance). KunServe's dispatcher (andante.cluster.kunserve.
router) sends arrivals to an instance that would start them at once: both take a share."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.core.request import RequestStatus
from andante.workload.spec import RequestSpec
from tests.sim.test_kunserve import _run, _spec

WAVE = 60.0  # the second wave arrives after the restore


@dataclass
class FirstOwner:
    """A cluster operator recording where each request was first placed, and when the
    groups restored."""

    owner: dict[str, int] = field(default_factory=dict)

    def after_step(self, controller: Controller) -> None:
        for slot in controller.slots:
            for req in controller.owned_by(slot.index):
                self.owner.setdefault(req.request_id, slot.index)


def _workload() -> list[RequestSpec]:
    short = [RequestSpec(0.01 * i, 400, 100) for i in range(100)]
    long = [RequestSpec(1.0 + 0.01 * i, 400, 2000) for i in range(8)]
    wave = [RequestSpec(WAVE + 0.05 * i, 300, 200) for i in range(100)]
    return short + long + wave


def test_after_a_restore_arrivals_are_spread_over_leader_and_member() -> None:
    owners = FirstOwner()
    spec = _spec(restore_window_seconds=0.0, idle_restore_seconds=2.0)
    requests, counters, sim = _run(spec, _workload(), owners)
    assert counters["num_drops"] >= 1 and counters["num_restores"] >= 1
    groups = sim.controller.router.counters.groups  # type: ignore[attr-defined]
    restore = max((e for e in groups.events if e.kind == "restore" and e.time < WAVE),
                  key=lambda e: e.time)  # the last restore before the wave
    regroup = min((e.time for e in groups.events if e.kind == "form" and e.time > WAVE),
                  default=float("inf"))
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    wave = Counter(owners.owner[r.request_id] for r in requests
                   if WAVE <= r.arrival_time < regroup)  # both serve alone meanwhile
    assert sum(wave.values()) >= 30, wave
    assert all(wave[i] >= 0.2 * sum(wave.values()) for i in restore.members), wave
