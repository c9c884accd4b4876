"""Decode runs (applying identical decode steps at once) change nothing but speed; the
stop rules they rely on."""

from __future__ import annotations

import pytest

from andante.core import PreemptionMode, Request, RequestStatus, SamplingParams
from andante.engine.stopping import check_stop, num_tokens_before_length_stop
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, build_simulator, simulate
from andante.sim.setup import with_router
from andante.workload import WorkloadConfig, build_workload, to_requests


def _timelines(run) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    return {
        r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                       r.timeline.num_swaps_out, r.status)
        for r in run.requests
    }


@pytest.mark.parametrize("policy", ["vllm", "vllm-v0", "sarathi", "priority", "edf", "qlm-edf",
                                    "sjf",
                                    "static-batch"])
@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_decode_runs_give_identical_timelines(policy: str, mode: PreemptionMode) -> None:
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=40.0, cv=3.0, num_requests=150, lengths="uniform:32:1500:1:300",
        seed=3,
    ))
    # a small KV cache so that preemptions and swaps happen too
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a10-24g", num_instances=2, policy=policy,
        scheduler=SchedulerConfig(preemption_mode=mode, max_num_seqs=64),
        gpu_memory_utilization=0.85,
    )
    stepped = simulate(spec, workload, decode_runs=False)
    fast = simulate(spec, workload, decode_runs=True)
    assert _timelines(fast) == _timelines(stepped)
    assert fast.report.end_time == stepped.report.end_time
    steps = [s.num_steps for s in fast.report.instance_stats]
    assert steps == [s.num_steps for s in stepped.report.instance_stats]


@pytest.mark.parametrize("policy", ["fastserve", "fastserve-fcfs"])
@pytest.mark.parametrize(("hardware", "starve_limit"),
                         [("a100-80g", 3.0), ("a100-80g", 0.01), ("a10-24g", 3.0)])
def test_fastserve_decode_runs_give_identical_timelines(policy: str, hardware: str,
                                                        starve_limit: float) -> None:
    """FastServe's MLFQ state is replayed after a run: demotions and promotions (a
    starvation limit below a step's time promotes every job each step) come out as
    stepping would make them, so later decisions match too."""
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=20.0, cv=3.0, num_requests=150, lengths="uniform:32:1500:1:300",
        seed=3,
    ))
    options = {"starve_limit": starve_limit} if policy == "fastserve" else {}
    spec = ClusterSpec(model="llama-3.1-8b", hardware=hardware, policy=policy,
                       policy_options=options, scheduler=SchedulerConfig(max_num_seqs=64),
                       gpu_memory_utilization=0.85)
    stepped = simulate(spec, workload, decode_runs=False)
    fast = simulate(spec, workload, decode_runs=True)
    assert _timelines(fast) == _timelines(stepped)
    assert fast.report.end_time == stepped.report.end_time
    if hardware == "a100-80g":  # room for every job: runs happen
        sim = build_simulator(spec, decode_runs=True)
        engine = sim.instances[0].engine
        outputs: list[int] = []
        engine.add_observer(lambda out, stats: outputs.append(out.num_steps))
        sim.run(to_requests(workload))
        assert max(outputs) > 1


@pytest.mark.parametrize("policy", ["ascendra-lp", "ascendra-hp"])
def test_ascendra_decode_runs_feed_the_perf_model_as_stepping(policy: str) -> None:
    """Runs apply; the online performance model sees every step (its samples and error
    are the same), so refits and the decisions after them are too."""
    workload = build_workload(WorkloadConfig(
        kind="gamma", rate=8.0, cv=3.0, num_requests=150, lengths="uniform:32:1500:1:300",
        seed=3,
    ))
    spec = ClusterSpec(model="llama-3.1-8b", hardware="a100-80g", policy=policy,
                       policy_options={"refit_every": 64, "tolerance": 0.0})
    models = {}
    for runs in (False, True):
        sim = build_simulator(spec, decode_runs=runs)
        engine = sim.instances[0].engine
        outputs: list[int] = []
        engine.add_observer(lambda out, stats, o=outputs: o.append(out.num_steps))
        requests = to_requests(workload)
        sim.run(requests)
        models[runs] = (engine.scheduler.policy.perf_model, _timelines_of(requests), outputs)
    (stepped, stepped_lines, _), (fast, fast_lines, outputs) = models[False], models[True]
    assert max(outputs) > 1
    assert fast_lines == stepped_lines
    assert fast.num_fits == stepped.num_fits > 0
    assert fast.error == stepped.error
    assert fast.cost_model.coefficients == stepped.cost_model.coefficients


def _timelines_of(requests: list[Request]) -> dict[str, tuple]:
    return {r.request_id: (tuple(r.timeline.token_times), r.status) for r in requests}


def test_until_is_respected_by_decode_runs() -> None:
    workload = build_workload(WorkloadConfig(kind="poisson", rate=5.0, num_requests=20,
                                             lengths="fixed:64:2000", seed=0))
    stepped = simulate(ClusterSpec(), workload, until=3.0, decode_runs=False)
    fast = simulate(ClusterSpec(), workload, until=3.0, decode_runs=True)
    assert _timelines(fast) == _timelines(stepped)


def test_observers_see_every_step_including_decode_runs() -> None:
    workload = build_workload(WorkloadConfig(kind="poisson", rate=4.0, num_requests=30,
                                             lengths="uniform:32:400:1:300", seed=5))
    seen: dict[bool, list[tuple[int, int, float]]] = {}
    for runs in (False, True):
        sim = build_simulator(ClusterSpec(), decode_runs=runs)
        engine = sim.instances[0].engine
        outputs: list[tuple[int, int, float]] = []
        engine.add_observer(lambda out, stats, o=outputs: o.append(
            (out.num_steps, len(out.updated), stats.time)))
        requests = to_requests(workload)
        sim.run(requests)
        assert sum(n for n, _, _ in outputs) == engine.num_steps
        assert engine.num_steps == sim.instances[0].stats.num_steps
        assert sum(n * k for n, k, _ in outputs) == sum(r.num_output_tokens for r in requests)
        times = [t for _, _, t in outputs]
        assert times == sorted(times)
        seen[runs] = outputs
    assert max(n for n, _, _ in seen[True]) > 1  # some runs stood for several steps
    assert len(seen[True]) < len(seen[False])
    assert seen[True][-1][2] == seen[False][-1][2]


@pytest.mark.parametrize(("max_tokens", "prompt", "max_model_len"), [(5, 10, 100), (50, 10, 30)])
def test_the_count_form_agrees_with_check_stop(max_tokens: int, prompt: int,
                                               max_model_len: int) -> None:
    limit = max_model_len  # Scheduler.max_num_tokens when the KV cache is larger
    req = Request("r", [1] * prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
    count = num_tokens_before_length_stop([req], limit)
    assert count == min(max_tokens, max_model_len - prompt)
    for i in range(count):
        req.append_output_token(7, float(i))
        expected = RequestStatus.FINISHED_LENGTH if i == count - 1 else None
        assert check_stop(req, 7, limit) == expected
        assert num_tokens_before_length_stop([req], limit) == count - i - 1


def test_stop_tokens_come_before_length() -> None:
    sampling = SamplingParams(max_tokens=1, stop_token_ids=(9,), eos_token_id=3)
    req = Request("r", [1], sampling, 0.0)
    req.append_output_token(9, 0.0)
    assert check_stop(req, 9, 100) == RequestStatus.FINISHED_STOPPED
    assert check_stop(req, 3, 100) == RequestStatus.FINISHED_STOPPED
    assert check_stop(req, 4, 100) == RequestStatus.FINISHED_LENGTH
    long = Request("l", [1], SamplingParams(max_tokens=10), 0.0)
    long.append_output_token(4, 0.0)
    assert check_stop(long, 4, 3) is None
    assert check_stop(long, 4, 2) == RequestStatus.FINISHED_LENGTH  # context or KV cache


def test_runs_match_stepping_on_an_ascendra_cluster_that_offloads() -> None:
    """Issue 30 item 8: an LP instance's step start may hand the HP instance a request
    amid the HP's run, so runs stop at the other instances' next events there (before:
    475 of 500 requests' token times differed, TTFT by 0.07%)."""
    workload = build_workload(WorkloadConfig(kind="poisson", rate=3.0, num_requests=300,
                                             lengths="sharegpt", max_context=8192, seed=0))
    spec = with_router(ClusterSpec(num_instances=2, scheduler=SchedulerConfig(
        enable_prefix_caching=False)), "ascendra", 1)
    runs = simulate(spec, workload, decode_runs=True)
    stepped = simulate(spec, workload, decode_runs=False)
    times = {r.request_id: r.timeline.token_times for r in stepped.requests}
    assert all(r.timeline.token_times == times[r.request_id] for r in runs.requests)
