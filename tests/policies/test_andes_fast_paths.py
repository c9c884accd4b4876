"""Andes' shortcuts decide as the full computation does: a chunked step whose running
requests fill the token budget skips the queue's gains (`_admits_nobody`)."""

from __future__ import annotations

import pytest

from andante.policies import SchedulerConfig
from andante.policies.andes import AndesPolicy
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests

ADMITS_NOBODY = AndesPolicy._admits_nobody


def _timelines(shortcut: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, tuple], int]:
    taken = []
    original = ADMITS_NOBODY

    def admits_nobody(self, *args):  # type: ignore[no-untyped-def]
        result = original(self, *args)
        taken.append(result)
        return result and shortcut

    monkeypatch.setattr(AndesPolicy, "_admits_nobody", admits_nobody)
    workload = build_workload(WorkloadConfig(  # long prompts: many chunked steps
        kind="poisson", rate=2.0, num_requests=150, lengths="uniform:200:6000:20:400", seed=3,
    ))
    spec = ClusterSpec(model="llama-3.1-8b", hardware="a100-80g", policy="andes",
                       scheduler=SchedulerConfig(max_num_seqs=64),
                       gpu_memory_utilization=0.85)
    requests = to_requests(workload)
    build_simulator(spec).run(requests)
    timelines = {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                                r.timeline.num_swaps_out, r.status) for r in requests}
    return timelines, sum(taken)


def test_skipping_the_gains_when_nobody_can_be_admitted_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    full, _ = _timelines(False, monkeypatch)
    fast, num_taken = _timelines(True, monkeypatch)
    assert num_taken > 0  # the shortcut applied
    assert fast == full


def _order_queue_scoring_all(self, plan, view):  # type: ignore[no-untyped-def]
    """`_order_queue` scoring the queue whatever its size (the full computation)."""
    import numpy as np

    from andante.policies.andes.knapsack import priority, starvation, top_order
    from andante.policies.andes.policy import Decision

    nr = view.num_running
    buffered = self.table.buffered(view.idx[:nr], plan.now)
    by_need = np.argsort(buffered, kind="stable")
    decision = Decision(decode_order=[view.reqs[i] for i in by_need])
    if len(view) == nr or self._admits_nobody(plan, view, buffered):
        return decision
    tau, gain = self._queue_scores(plan, view)
    starved = starvation(view, plan.now, self.starvation_limit)
    prio = priority(gain, view.weight[view.queued], view.kind[view.queued], self.options,
                    None if starved is None else starved[view.queued])
    order = top_order(prio, plan.config.max_num_seqs) + nr
    decision.admits = [view.reqs[i] for i in order]
    o = self.options
    victims = by_need[:0]
    fits = self._fits(plan, decision.admits[0])
    if o.pacer_aware and not fits:
        victims = by_need[::-1][buffered[by_need[::-1]] > o.delta_t]
    elif fits and o.pause_buffered_s > 0 and self._admits_all(plan, view):
        decision.decode_order = [view.reqs[i] for i in by_need
                                 if buffered[i] <= o.pause_buffered_s]
    if len(victims) or (o.refiner and self.refine_admissions and nr):
        gains = np.zeros(len(view))
        gains[view.queued] = gain
        decision.admits, decision.victims = self.refiner.refine(plan, view, order, victims,
                                                                gains, tau, starved)
    return decision


@pytest.mark.parametrize("options", [{}, {"chunked_prefill": False}])
def test_a_lone_queued_request_is_admitted_as_the_full_scoring_admits_it(
        options: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without scores for a lone queued request (first whatever its score; the refiner,
    when it weighs the admission, gets them): the timelines of scoring every queue."""
    workload = build_workload(WorkloadConfig(  # mostly one request queued at a time
        kind="poisson", rate=3.0, num_requests=120, lengths="uniform:200:3000:20:300",
        seed=4))
    spec = ClusterSpec(model="llama-3.1-8b", hardware="a10-24g", policy="andes",
                       policy_options=options, scheduler=SchedulerConfig(max_num_seqs=64),
                       gpu_memory_utilization=0.85)
    lines = []
    for full in (False, True):
        if full:
            monkeypatch.setattr(AndesPolicy, "_order_queue", _order_queue_scoring_all)
        requests = to_requests(workload)
        build_simulator(spec).run(requests)
        lines.append({r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                                     r.timeline.num_swaps_out) for r in requests})
    assert lines[0] == lines[1]
    assert any(n or s for _, n, s in lines[0].values())  # preemptions: refined pairs
