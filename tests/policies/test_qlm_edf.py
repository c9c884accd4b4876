"""`qlm-edf` (QLM's engine policy): running requests advance in every step, an
admission's prefill rides in the same step (the mixed steps of the `vllm` policy)."""

from __future__ import annotations

from andante.core.sampling import SLO
from tests.engine.helpers import make_engine, make_request


def test_running_requests_decode_in_the_steps_that_admit_new_ones() -> None:
    engine, _, _ = make_engine("qlm-edf", num_device_blocks=64, max_num_seqs=8)
    engine.add_request(make_request("run", 8, 50, slo=SLO(deadline=100.0)))
    engine.step()  # prefilled: it runs
    before = engine.scheduler.running[0].num_output_tokens
    for k in range(3):  # an arrival at every step, each more urgent than the runner
        engine.add_request(make_request(f"new{k}", 8, 5, arrival=0.1 * (k + 1),
                                        slo=SLO(deadline=1.0)))
        engine.step()
    runner = next(r for r in engine.scheduler.running if r.request_id == "run")
    assert runner.num_output_tokens == before + 3  # one token in each of the 3 steps
    assert {r.request_id for r in engine.scheduler.running} == {"run", "new0", "new1", "new2"}
