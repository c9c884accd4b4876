"""Ordered policies (vllm-v0, edf, sjf, priority, static-batch) keep the waiting queue
sorted without sorting it again at every arrival whose key does not decrease."""

from __future__ import annotations

import pytest

from andante.core.sampling import SLO
from tests.engine.helpers import make_engine, make_request


@pytest.mark.parametrize("policy", ["edf", "sjf", "vllm-v0"])
def test_waiting_queue_is_in_key_order_whatever_the_arrival_order(policy: str) -> None:
    engine, _, _ = make_engine(policy, num_device_blocks=8, max_num_seqs=1)
    engine.add_request(make_request("run", 8, 50, slo=SLO(deadline=1.0)))  # the most urgent
    engine.step()  # one running request fills the only slot: the rest wait
    # deadlines and prompt lengths: rising, then one below the rest, then rising again
    specs = [("a", 4, 10.0), ("b", 8, 20.0), ("c", 2, 5.0), ("d", 12, 30.0), ("e", 16, 40.0)]
    for k, (rid, prompt, deadline) in enumerate(specs):
        engine.add_request(make_request(rid, prompt, 5, arrival=0.1 * (k + 1),
                                        slo=SLO(deadline=deadline)))
        engine.step()
    waiting = [r.request_id for r in engine.scheduler.waiting]
    expected = {"edf": ["c", "a", "b", "d", "e"], "sjf": ["c", "a", "b", "d", "e"],
                "vllm-v0": ["a", "b", "c", "d", "e"]}
    assert waiting == expected[policy]
