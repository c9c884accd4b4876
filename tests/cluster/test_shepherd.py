"""The SHEPHERD-like baseline: static model placement + static deadline-ordered batches."""

from __future__ import annotations

import dataclasses

from andante.cluster.registry import make_router
from andante.core.sampling import SLO
from andante.sim import ClusterSpec, simulate
from andante.workload.spec import RequestSpec
from tests.cluster.fakes import FakeInstance, request


def _req(rid: str, model: str):  # type: ignore[no-untyped-def]
    req = request(rid)
    req.model = model
    return req


def test_shepherd_keeps_each_model_on_one_instance_and_spreads_models() -> None:
    router = make_router("shepherd")
    views = [FakeInstance(0), FakeInstance(1)]
    homes = {m: router.route(_req(f"{m}-{i}", m), views)
             for i in range(3) for m in ("a", "b", "c")}
    assert homes["a"] != homes["b"]
    seen = [router.route(_req(f"x{i}", "a"), views) for i in range(4)]
    assert set(seen) == {homes["a"]}
    views[homes["a"]].up = False
    moved = router.route(_req("y", "a"), views)
    assert moved is not None and moved != homes["a"]


def test_static_batch_admits_no_one_into_a_batch_in_flight() -> None:
    spec = dataclasses.replace(ClusterSpec(model="mistral-7b"), policy="static-batch",
                               policy_options={"batch_size": 4})
    early = [RequestSpec(0.0, 100, 200, slo=SLO(deadline=100.0)) for _ in range(4)]
    late = [RequestSpec(0.5, 100, 10, slo=SLO(deadline=1.0))]  # urgent, but a batch runs
    run = simulate(spec, early + late)
    finished = {r.request_id: r for r in run.report.finished}
    batch_end = max(finished[f"req-{i}"].timeline.finish_time for i in range(4))
    assert finished["req-4"].timeline.first_scheduled_time >= batch_end
    continuous = simulate(dataclasses.replace(spec, policy="edf", policy_options={}),
                          early + late)
    urgent = next(r for r in continuous.report.finished if r.request_id == "req-4")
    assert urgent.timeline.finish_time < batch_end
