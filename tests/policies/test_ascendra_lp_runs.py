"""`ascendra-lp`'s chunked prefills as simulator prefill runs change nothing but speed:
identical timelines, handoffs, steps and performance-model state to stepping (requests
waiting between runs, offloads, refits, a small KV cache; no run where the step time may
fall with more tokens), and runs do happen; the secant search finds the bisection's
chunk."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import ManualClock
from andante.exec.sim_executor import SimExecutor
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.specs import CostCoefficients
from andante.policies import SchedulerConfig
from andante.policies.ascendra.lp import largest_by_bisection, largest_within
from andante.policies.ascendra.prefill_runs import time_grows_with_tokens
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests
from tests.policies.ascendra_helpers import request


def _run(spec: ClusterSpec, workload, runs: bool):  # type: ignore[no-untyped-def]
    sim = build_simulator(spec, decode_runs=runs)
    engine = sim.instances[0].engine
    prefill_runs: list[bool] = []
    engine.add_observer(lambda out, stats: prefill_runs.append(
        out.num_steps > 1 and out.batch.num_tokens > len(out.batch.requests)))
    requests = to_requests(workload)
    report = sim.run(requests)
    model = engine.scheduler.policy.perf_model
    lines = {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                            r.status, r.num_computed_tokens) for r in requests}
    state = (model.num_fits, model.error, model.cost_model.coefficients,
             list(model._samples), report.end_time, sim.controller.num_handoffs,
             [s.num_steps for s in report.instance_stats])
    return lines, state, sum(prefill_runs)


def _spec(hardware: str, **options: object) -> ClusterSpec:
    return ClusterSpec(
        model="llama-3.1-8b", hardware=hardware, policy="ascendra-lp",
        policy_options={"refit_every": 64, "tolerance": 0.0, **options},
        scheduler=SchedulerConfig(max_num_seqs=64),
        gpu_memory_utilization=0.85,
    )


@pytest.mark.parametrize(("hardware", "rate", "num", "lengths", "options"), [
    # long prompts in chunks, requests waiting behind them, offloads (back here)
    ("a100-80g", 3.0, 120, "uniform:64:7000:1:300", {}),
    ("a100-80g", 6.0, 120, "uniform:64:7000:1:300", {"offload": False, "value": "sjf",
                                                      "min_chunk": 16}),
    # a small KV cache: preemptions (recomputed prompts)
    ("a10-24g", 1.0, 50, "uniform:2000:7000:500:1500", {"ttft_slo": 10.0}),
])
def test_prefill_runs_give_identical_timelines(hardware: str, rate: float, num: int,
                                               lengths: str,
                                               options: dict[str, object]) -> None:
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=rate, cv=3.0, num_requests=num, lengths=lengths, seed=7,
        max_context=8192,
    ))
    spec = _spec(hardware, **options)
    stepped, stepped_state, none = _run(spec, workload, runs=False)
    fast, fast_state, num_runs = _run(spec, workload, runs=True)
    assert none == 0 and num_runs > 0
    assert fast == stepped
    assert fast_state == stepped_state


def test_a_model_whose_time_may_fall_gives_no_chunks() -> None:
    """With a serial regime (a CPU engine) or size factors the step time may fall as a
    chunk grows, so the chunk the step's search finds depends on its range: no run is
    planned."""
    chunked = request("a", 5000)
    for hardware, expected in [
        (get_hardware("a100-80g"), [2048, 2048, 904]),  # no decodes: N caps each chunk
        (replace(get_hardware("a100-80g"), serial_coefficients=CostCoefficients(),
                 serial_below_tokens=64), []),
        (replace(get_hardware("a100-80g"), prefill_factors=(1.0,) * 10 + (0.6,)), []),
        (replace(get_hardware("a100-80g"), decode_factors=(1.3,)), []),
    ]:
        executor = SimExecutor(CostModel(get_model("mistral-7b"), hardware))
        eng = build_engine(executor, ManualClock(), "ascendra-lp",
                           SchedulerConfig(max_num_seqs=128), None)
        policy = eng.scheduler.policy
        assert time_grows_with_tokens(policy.perf_model.cost_model) == bool(expected)
        assert policy.prefill_run_chunks([chunked], False) == expected
        assert policy.prefill_run_chunks([chunked], True) == []


def test_a_run_ends_at_the_models_next_refit_check() -> None:
    """The chunks after a refit check would come from a model not known yet."""
    eng = build_engine(SimExecutor(CostModel(get_model("mistral-7b"),
                                             get_hardware("a100-80g"))),
                       ManualClock(), "ascendra-lp", SchedulerConfig(max_num_seqs=128),
                       {"refit_every": 2})
    policy = eng.scheduler.policy
    assert policy.perf_model.steps_before_refit == 2
    assert policy.prefill_run_chunks([request("a", 5000)], False) == [2048, 2048]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=2, max_value=5000),
    st.floats(min_value=0.0, max_value=1e-3), st.floats(min_value=0.0, max_value=1e-6),
    st.floats(min_value=0.0, max_value=1e-9), st.integers(min_value=0, max_value=4000),
    st.floats(min_value=0.0, max_value=0.2), st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=-1, max_value=6000),
)
def test_secant_search_finds_the_bisections_answer(
        limit: int, fixed: float, linear: float, quadratic: float, kink: int,
        jump: float, budget_share: float, hint: int) -> None:
    """Any non-decreasing step time (kinks and jumps included, as max() and sampling
    make them), from any first probe: the same n as the bisection it replaces."""
    def time_of(n: int) -> float:
        return fixed + linear * n + quadratic * n * n + (jump if n >= kink else 0.0)

    t_limit = time_of(limit)
    budget = budget_share * t_limit
    if t_limit <= budget:
        return
    assert largest_within(time_of, limit, budget, t_limit, hint) == \
        largest_by_bisection(time_of, limit, budget)


def test_secant_search_with_a_flat_step_time() -> None:
    assert largest_within(lambda n: 1.0, 10, 0.5, 1.0) == 0
    assert largest_within(lambda n: 1.0, 1, 0.5, 1.0, hint=5) == 0
    assert largest_within(lambda n: 0.5 if n < 7 else 1.0, 10, 0.5, 1.0) == 6
    assert largest_within(lambda n: 0.0 if n < 10 else math.inf, 10, 0.5, math.inf) == 9
