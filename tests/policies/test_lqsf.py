"""`lqsf`: Andes' gain without the per-block normalizer, refiner or batch search."""

from __future__ import annotations

from andante.core import ManualClock
from andante.core.sampling import SLO
from andante.llm import build_engine
from andante.policies import SchedulerConfig
from andante.policies.andes import AndesPolicy
from andante.policies.lqsf import LQSFOptions, LQSFPolicy
from tests.engine.helpers import FakeExecutor, make_request, run_to_completion


def _engine(policy: str, num_blocks: int):  # type: ignore[no-untyped-def]
    clock = ManualClock()
    config = SchedulerConfig(block_size=4, watermark=0.0, max_model_len=128,
                             max_num_batched_tokens=128, max_num_seqs=1)
    engine = build_engine(FakeExecutor(num_blocks), clock, policy, config)
    return engine, clock


def test_presets() -> None:
    o = LQSFOptions()
    assert not (o.size_aware or o.refiner or o.batch_search or o.pacer_aware)
    assert o.max_preemptions == 1 and issubclass(LQSFPolicy, AndesPolicy)


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
