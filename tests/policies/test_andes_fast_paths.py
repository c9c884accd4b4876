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
