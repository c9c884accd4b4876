"""KunServe on the simulator: under a second wave of pressure a solo joins the formed
pipeline group (a grow), the group's leader keeps leading; as the pressure falls the
group first releases that member (shrink by one), then restores; no request is lost."""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.cluster.controller import Controller
from andante.core.request import RequestStatus
from andante.sim.setup import build_simulator
from andante.workload.spec import RequestSpec, to_requests
from tests.sim.test_kunserve import _spec


@dataclass
class GroupHistory:
    """A cluster operator recording each change of the groups' member lists."""

    groups: object
    seen: list[tuple[tuple[int, ...], ...]] = field(default_factory=list)

    def after_step(self, controller: Controller) -> None:
        plans = tuple(g.members for g in self.groups.groups())  # type: ignore[attr-defined]
        if not self.seen or self.seen[-1] != plans:
            self.seen.append(plans)


def test_a_pressed_group_grows_by_a_solo_then_shrinks_by_one_then_restores() -> None:
    sim = build_simulator(_spec(num_instances=3, restore_window_seconds=0.0))
    groups = sim.controller.router.counters.groups  # type: ignore[attr-defined]
    history = GroupHistory(groups)
    sim.controller.operators.append(history)  # type: ignore[arg-type]
    # two waves 3 s apart: the first throttles a pair, the second the pair again
    specs = [RequestSpec(0.01 * i + (3.0 if i >= 120 else 0.0), 400, 300) for i in range(240)]
    specs += [RequestSpec(20.0 + 0.5 * i, 400, 100) for i in range(60)]  # then a trickle
    requests = to_requests(specs)
    report = sim.run(requests)
    assert not report.unfinished
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    pairs = [p[0] for p in history.seen if len(p) == 1 and len(p[0]) == 2]
    triples = [p[0] for p in history.seen if len(p) == 1 and len(p[0]) == 3]
    assert pairs and triples, history.seen
    pair, triple = pairs[0], triples[0]
    assert triple[:2] == pair  # the grow: the pair's leader leads, its stages first
    forms = [e for e in groups.events if e.kind == "form"]
    assert [e.members for e in forms[:2]] == [pair, triple]
    assert forms[1].num_adopted > 0  # the joiner's running requests moved with their KV
    after = history.seen[history.seen.index((triple,)):]
    assert after[:3] == [(triple,), (pair,), ()]  # shrink by one, then restore
    shrink = next(e for e in groups.events if e.kind == "shrink")
    assert shrink.members == triple and shrink.bytes_moved > 0  # its layers' KV moved
    counters = report.router_counters
    assert counters["num_shrinks"] == 1 and counters["num_restores"] == 1
    assert [e.grow for e in forms[:2]] == [False, True] and counters["num_grows"] == 1
    for inst in sim.instances:
        inst.engine.scheduler.kv.check_invariants()
