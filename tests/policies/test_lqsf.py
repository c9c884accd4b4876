"""`lqsf`: Andes' gain without the per-block normalizer, refiner or batch search."""

from __future__ import annotations

from andante.core import ManualClock, RequestStatus
from andante.core.sampling import SLO
from andante.llm import build_engine
from andante.policies import SchedulerConfig
from tests.engine.helpers import FakeExecutor, make_request, run_to_completion


def _engine(policy: str, num_blocks: int):  # type: ignore[no-untyped-def]
    clock = ManualClock()
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=128,
                             max_num_batched_tokens=128, max_num_seqs=1)
    engine = build_engine(FakeExecutor(num_blocks), clock, policy, config)
    return engine, clock


def test_preempts_at_most_one_request_per_decision() -> None:
    """Memory full of buffered readers (gain 0) and a fresh request that needs two of
    them preempted: LQSF preempts one and admits nothing yet; without its cap of one
    preemption per decision (Andes' public LQF code) it preempts both and admits it."""
    outcome = {}
    for cap in (1, None):
        clock = ManualClock()
        config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=128,
                                 max_num_batched_tokens=128)
        engine = build_engine(FakeExecutor(10), clock, "lqsf", config, {"max_preemptions": cap})
        readers = [make_request(f"r{i}", 8, 50, slo=SLO(ttft=1.0, tds=1.0)) for i in range(3)]
        for req in readers:
            engine.add_request(req)
        for _ in range(4):
            engine.step()
            clock.advance_to(clock.now() + 0.01)
        fresh = make_request("fresh", 20, 4, arrival=clock.now(), slo=SLO(ttft=1.0, tds=5.0))
        engine.add_request(fresh)
        batch = engine.step().batch
        outcome[cap] = (sum(r.status == RequestStatus.PREEMPTED for r in readers),
                        fresh in batch.requests)
    assert outcome == {1: (1, False), None: (2, True)}


def test_orders_by_gain_alone_while_andes_divides_by_size() -> None:
    """Two fresh requests gain the same (both can still be perfect): LQSF keeps them in
    queue order, Andes takes the one that needs fewer KV blocks first."""
    first = {}
    for policy in ("lqsf", "andes"):
        engine, clock = _engine(policy, 256)
        engine.add_request(make_request("long", 100, 2, slo=SLO(ttft=1.0, tds=5.0)))
        engine.add_request(make_request("short", 8, 2, slo=SLO(ttft=1.0, tds=5.0)))
        clock.advance_to(0.5)
        out = engine.step()
        first[policy] = out.batch.requests[0].request_id
        run_to_completion(engine, clock)
    assert first == {"lqsf": "long", "andes": "short"}
