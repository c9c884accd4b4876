"""Andes and LQSF on the simulator's prefill runs (andante.sim.prefill_run) and on the
decode runs that start after a finish or a completed prefill (andante.sim.after_finish):
the same timelines and the same policy state as stepping, with far fewer decisions."""

from __future__ import annotations

import pytest

from andante.engine.plan import StepPlan
from andante.policies import SchedulerConfig
from andante.policies.andes import AndesPolicy
from andante.sim import ClusterSpec, build_simulator
from andante.workload import WorkloadConfig, build_workload, to_requests
from andante.workload.slo import SLOConfig

# long prompts (several 1,024-token chunks each) at a rate that often empties the queue
LONG_PROMPTS = WorkloadConfig(kind="poisson", rate=1.0, num_requests=80,
                              lengths="uniform:300:5000:1:250", seed=11, max_context=8192)
# bursts on a small KV cache: the queue fills, blocks run short, requests are preempted
BURSTS = WorkloadConfig(kind="gamma", rate=8.0, cv=3.0, num_requests=100,
                        lengths="uniform:200:4000:1:300", seed=6, max_context=8192)
# fast readers: the compute-bound trigger fires whenever the knapsack is due
FAST_READERS = WorkloadConfig(kind="poisson", rate=1.0, num_requests=60,
                              lengths="uniform:300:3000:1:200", seed=3, max_context=8192,
                              slo=SLOConfig(tds=100.0))
# readers at 16 tokens/s: decode steps keep pace, prompt chunks beside them do not
MID_READERS = WorkloadConfig(kind="gamma", rate=3.0, cv=2.0, num_requests=60,
                             lengths="uniform:3000:8000:50:300", seed=5, max_context=8192,
                             slo=SLOConfig(tds=16.0))
# 2,050-token prompts: chunks of 1,024 (admission), 1,025 and a final one of one token
ONE_TOKEN_TAIL = WorkloadConfig(kind="poisson", rate=0.5, num_requests=40,
                                lengths="fixed:2050:200", seed=8)
# 20 requests at once whose outputs fill a small KV cache: blocks run short unqueued
GROWING = WorkloadConfig(kind="gamma", rate=100.0, cv=1.0, num_requests=20,
                         lengths="uniform:400:600:1000:1500", seed=4)

# ShareGPT lengths on a small KV: the queue waits for blocks while the running decode
PRESSURE = WorkloadConfig(kind="poisson", rate=1.5, num_requests=150, lengths="sharegpt",
                          max_context=8192, seed=0)


def _run(policy: str, workload: WorkloadConfig, hardware: str, runs: bool,
         options: dict[str, object] | None = None,
         ) -> tuple[dict, tuple, list[tuple], list[tuple]]:
    spec = ClusterSpec(model="llama-3.1-8b", hardware=hardware, policy=policy,
                       policy_options=options or {},
                       scheduler=SchedulerConfig(max_num_seqs=64),
                       gpu_memory_utilization=0.85)
    sim = build_simulator(spec, decode_runs=runs)
    engine = sim.instances[0].engine
    outputs: list[tuple] = []  # (steps, new tokens, requests, finished) per output
    engine.add_observer(lambda out, stats: outputs.append(
        (out.num_steps, out.batch.num_tokens, len(out.batch.requests), len(out.finished))))
    p = engine.scheduler.policy
    assert isinstance(p, AndesPolicy)
    seen = _watch_queued_decisions(p)
    requests = to_requests(build_workload(workload))
    report = sim.run(requests)
    timelines = {r.request_id: (tuple(r.timeline.token_times), r.timeline.num_recomputes,
                                r.timeline.num_swaps_out, r.status) for r in requests}
    lat = p.latency
    state = (report.end_time, engine.num_steps, p.stats.num_solves, p._since_solve,
             lat.token_latency, lat.ratio, lat.mean_context, lat._last_decode_end,
             [r.request_id for r in report.finished])  # (in the order they finished)
    return timelines, state, outputs, seen


def _watch_queued_decisions(policy: AndesPolicy) -> list[tuple]:
    """What the policy knows at each decision with a queue (runs never span one): the
    running requests' QoE state and the latency estimate."""
    seen: list[tuple] = []
    schedule = policy.schedule

    def watched(plan: StepPlan) -> None:
        if plan.waiting or plan.swapped:
            idx = policy.table.indices(plan.running)
            t = policy.table
            seen.append((plan.now, policy.latency.token_latency, policy._since_solve,
                         t.n[idx].tolist(), t.late[idx].tolist(), t.pos[idx].tolist()))
        schedule(plan)

    policy.schedule = watched  # type: ignore[method-assign]
    return seen


CASES = [("andes", LONG_PROMPTS, "a100-80g", None), ("andes", BURSTS, "a10-24g", None),
         ("andes", LONG_PROMPTS, "a100-80g", {"solver_interval": 1}),
         ("andes", FAST_READERS, "a100-80g", {"solver_interval": 3}),
         ("andes", MID_READERS, "a100-80g", None),
         ("andes", GROWING, "a10-24g", None), ("andes", ONE_TOKEN_TAIL, "a100-80g", None),
         ("lqsf", LONG_PROMPTS, "a100-80g", None), ("lqsf", BURSTS, "a10-24g", None),
         ("lqsf", GROWING, "a10-24g", {"solver_interval": 1}),
         ("andes", PRESSURE, "a10-24g", None),
         ("andes", PRESSURE, "a10-24g", {"pacer_aware": False})]


@pytest.mark.parametrize(("policy", "workload", "hardware", "options"), CASES)
def test_runs_give_the_stepped_timelines_and_state(policy: str, workload: WorkloadConfig,
                                                    hardware: str,
                                                    options: dict[str, object] | None) -> None:
    stepped, stepped_state, stepped_outputs, stepped_seen = _run(policy, workload, hardware,
                                                                 False, options)
    fast, fast_state, outputs, seen = _run(policy, workload, hardware, True, options)
    assert fast == stepped
    assert fast_state == stepped_state  # end, steps, solves, latency EMAs, finish order
    # the decisions with a queue that were taken (runs stand for some) knew the same
    by_time = {d[0]: d for d in stepped_seen}
    assert seen and all(by_time[d[0]] == d for d in seen)
    assert len(outputs) < len(stepped_outputs)
    if workload is LONG_PROMPTS:  # mostly nothing queued: most steps are in runs
        assert len(outputs) < len(stepped_outputs) / 3


def test_andes_prefills_long_prompts_in_runs() -> None:
    """Several chunks of a prompt beside decodes in one output, including right after
    the step that admitted it."""
    _, _, outputs, _ = _run("andes", LONG_PROMPTS, "a100-80g", True)
    prefill_runs = [o for o in outputs if o[0] > 1 and o[1] > o[2]]
    assert len(prefill_runs) > 10


def test_andes_runs_start_after_finishes_without_a_step() -> None:
    _, _, outputs, _ = _run("andes", LONG_PROMPTS, "a100-80g", True)
    assert any(a[3] and a[0] > 1 and b[0] > 1 and b[1] == b[2]
               for a, b in zip(outputs, outputs[1:], strict=False))


def test_a_due_knapsack_leaves_the_step_to_the_policy() -> None:
    """With the compute-bound trigger due at every step (fast readers, interval 1) the
    knapsack's order is the priorities': `decode_order` declines."""
    workload = WorkloadConfig(kind="poisson", rate=1.0, num_requests=30,
                              lengths="uniform:100:400:50:100", seed=2)
    spec = ClusterSpec(policy="andes", policy_options={"solver_interval": 1})
    sim = build_simulator(spec)
    policy = sim.instances[0].engine.scheduler.policy
    assert isinstance(policy, AndesPolicy)
    policy.latency.token_latency = 1e9  # slower than any reader: due and triggered
    running = to_requests(build_workload(workload))[:3]
    assert policy.decode_order(running, 10**6) is None
    policy.latency.token_latency = 0.0
    assert policy.decode_order(running, 10**6) == running


def test_short_of_blocks_the_emptiest_pacer_buffers_decode_first() -> None:
    spec = ClusterSpec(policy="andes")
    policy = build_simulator(spec).instances[0].engine.scheduler.policy
    assert isinstance(policy, AndesPolicy)
    running = to_requests(build_workload(WorkloadConfig(
        kind="poisson", rate=1.0, num_requests=3, lengths="fixed:100:50", seed=1)))
    slots = policy.table.indices(running)
    for t in (5.0, 5.1, 5.2):  # the first reader got three tokens, the last one
        policy.table.record(slots[:1], t)
    policy.table.record(slots[2:], 5.0)
    assert policy.decode_order(running, 10**6) == running  # blocks for all: any order
    assert policy.decode_order(running, 0) == [running[1], running[2], running[0]]


@pytest.mark.parametrize(("workload", "hardware"), [(LONG_PROMPTS, "a100-80g"),
                                                    (BURSTS, "a10-24g"),
                                                    (MID_READERS, "a100-80g")])
def test_runs_while_requests_wait_keep_andes_deciding_the_same(
        workload: WorkloadConfig, hardware: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every prefill run that starts with requests queued (checked from the scheduler's
    state, not the policy's): its steps are shorter than every reader's pace and its
    latency estimate starts below it (no compute-bound trigger), and it leaves free
    the memory trigger's share of the device and the queue's blocks beside the
    watermark (nobody could be paired with a victim)."""
    from andante.sim.simulator import SimInstance

    checked: list[int] = []
    begin = SimInstance.begin_prefill_run

    def begin_checked(self, runs, batch, times, durations, chunks):  # type: ignore[no-untyped-def]
        s = self.engine.scheduler
        queued = [*s.waiting, *s.swapped]
        if queued:
            p = s.policy
            min_inv = min(1.0 / r.slo.tds for r in [*s.running, *queued])
            assert p.latency.token_latency < min_inv and max(durations) < min_inv
            bs, kv = s.config.block_size, s.kv
            weight = sum(-(-(r.num_prompt_tokens + r.num_output_tokens + 1) // bs)
                         for r in queued)
            begin(self, runs, batch, times, durations, chunks)
            free = kv.num_free_device_blocks
            assert free > (1.0 - p.options.watermark) * kv.device.num_blocks
            assert free >= kv.watermark_blocks + weight
            checked.append(len(chunks))
            return
        begin(self, runs, batch, times, durations, chunks)

    monkeypatch.setattr(SimInstance, "begin_prefill_run", begin_checked)
    _run("andes", workload, hardware, True)
    if workload is LONG_PROMPTS:
        assert checked  # such runs happen


@pytest.mark.parametrize("options", [None, {"pacer_aware": False}])
def test_decode_runs_while_the_queue_waits_for_blocks(
        options: dict[str, object] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under memory pressure Andes decodes in runs while requests wait (the stepped
    timelines and state: `CASES`); checked from the scheduler's state, not the
    policy's: at the start of each such run the request first in line (the one longest
    past its TTFT target) finds no room for all its tokens, or more of them than a step
    may compute."""
    from andante.core.request import RequestStatus
    from andante.policies.andes.qoe import DEFAULT_TTFT_TARGET
    from andante.sim.simulator import SimInstance

    queued_runs: list[int] = []
    begin = SimInstance.begin_decode_run

    def begin_checked(self, runs, batch, times, durations):  # type: ignore[no-untyped-def]
        s = self.engine.scheduler
        queued = [*s.waiting, *s.swapped]
        if queued:
            never_served = [r for r in queued if not r.timeline.token_times]
            if never_served:
                first = min(never_served, key=lambda r: r.arrival_time + (
                    r.slo.ttft if r.slo.ttft is not None else DEFAULT_TTFT_TARGET))
                kv, rid = s.kv, first.request_id
                if first.status == RequestStatus.SWAPPED:
                    need = kv.num_new_blocks_needed(rid, first.num_tokens)
                    assert not kv.can_swap_in(rid, need)
                else:
                    assert not kv.can_allocate(rid, first.num_tokens) or (
                        first.num_uncomputed_tokens > s.config.max_num_batched_tokens)
            queued_runs.append(len(times))
        begin(self, runs, batch, times, durations)

    monkeypatch.setattr(SimInstance, "begin_decode_run", begin_checked)
    _run("andes", PRESSURE, "a10-24g", True, options)
    assert len(queued_runs) > 20 and max(queued_runs) > 1


@pytest.mark.parametrize("workload", [BURSTS, pytest.param(PRESSURE, marks=pytest.mark.slow)])
def test_decode_runs_span_a_due_knapsack_that_decides_nothing(
        workload: WorkloadConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under memory pressure a decode run with requests queued may pass the knapsack's
    due step when its decision there is sure to change nothing (the usage at the
    watermark, the refiner's budget spent, no queued request fits beside the
    watermark): the stepped timelines and state, solves counted (issue 30, item 7)."""
    proven: list[bool] = []
    original = AndesPolicy._solves_change_nothing

    def watched(self, plan, view):  # type: ignore[no-untyped-def]
        result = original(self, plan, view)
        proven.append(result)
        return result

    monkeypatch.setattr(AndesPolicy, "_solves_change_nothing", watched)
    stepped, stepped_state, _, stepped_seen = _run("andes", workload, "a10-24g", False)
    proven.clear()
    fast, fast_state, _, seen = _run("andes", workload, "a10-24g", True)
    assert any(proven)
    assert fast == stepped
    assert fast_state == stepped_state  # end, steps, solves, latency EMAs, finish order
    by_time = {d[0]: d for d in stepped_seen}
    assert all(by_time[d[0]] == d for d in seen)
