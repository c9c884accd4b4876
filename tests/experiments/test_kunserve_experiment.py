"""`andante experiment kunserve --quick` writes its report; the baselines' specs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from andante.core.request import PreemptionMode
from experiments.kunserve_runs import (
    CHAT,
    RunResult,
    base_spec,
    burstgpt_shaped,
    cyclic,
    demand_scaling,
    drop_headroom,
    slo_causes,
    slo_violations,
    system_spec,
)
from experiments.kunserve_text import (
    binding_text,
    bound_of,
    exchange_text,
    headroom_text,
    slo_text,
)
from experiments.registry import ExperimentContext, experiment_names, run_experiment


def test_systems_are_the_papers_baselines() -> None:
    spec = base_spec("qwen2.5-14b", "a100-80g", 1, 4)
    assert system_spec(spec, "vllm") == spec
    pp = system_spec(spec, "vllm-pp")
    assert (pp.pp, pp.num_instances) == (2, 2)
    swap = system_spec(spec, "infercept")
    assert swap.scheduler.preemption_mode == PreemptionMode.SWAP and swap.overlap_swaps
    kun = system_spec(spec, "kunserve", lookahead=False)
    assert kun.router == "kunserve" and kun.router_options == {"lookahead": False}
    assert system_spec(spec, "llumnix").router == "llumnix"
    with pytest.raises(ValueError):
        system_spec(spec, "nope")
    burst = cyclic(4.0, 120.0, seed=0, intensity=3.0)
    first = [r for r in burst if r.arrival_time < 24.0]
    assert len(first) > 0.3 * len(burst)  # 3x the rate over 20% of the cycle


def test_rates_follow_littles_law_on_kv_memory() -> None:
    spec = base_spec("qwen2.5-14b", "a100-80g", 1, 4)
    half, most = demand_scaling(spec, 0.5), demand_scaling(spec, 0.8)
    assert half.capacity_tokens > 4 * 200_000  # ~232k KV tokens per A100 instance
    assert half.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2  # 14B: 48 layers, 8 KV heads
    resident = half.mean_prompt + half.mean_output / 2
    demand = half.rate * half.mean_output * half.tpot_s * resident  # Little's law
    assert abs(demand - 0.5 * half.capacity_tokens) < 1e-6 * half.capacity_tokens
    assert most.rate > half.rate and most.tpot_s > half.tpot_s  # more prefill, slower


@pytest.mark.slow
def test_quick_experiment_writes_report_plots_and_results(tmp_path: Path) -> None:
    assert "kunserve" in experiment_names()
    run_experiment("kunserve", ExperimentContext(tmp_path, quick=True))
    assert (tmp_path / "report.md").read_text().startswith("# KunServe")
    for name in ("burstgpt_14b_timeline", "burstgpt_14b_slo", "burstgpt_72b_timeline"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    assert {row["system"] for row in results["burstgpt_14b"]} == {
        "vllm", "vllm-pp", "infercept", "llumnix", "kunserve"}
    rows = {row["system"]: row for row in results["burstgpt_14b"]}
    assert all(row["unfinished"] == 0 for row in rows.values())  # no request lost
    assert len({row["requests"] for row in rows.values()}) == 1
    kun = rows["kunserve"]
    assert kun["drops"] >= 1 and kun["restores"] >= 1  # the burst formed a group, undone
    assert rows["vllm"]["drops"] == 0 and rows["vllm"]["peak_kv_use"] > 0.95
    assert kun["p99_ttft_s"] < rows["vllm"]["p99_ttft_s"]
    llumnix = rows["llumnix"]
    assert llumnix["p99_ttft_s"] != rows["vllm"]["p99_ttft_s"]  # it migrates
    claims = {row["claim"] for row in results["paper_table"]}
    assert "P99 TTFT reduction vs llumnix, 72B, 2x bursts" in claims
    report = (tmp_path / "report.md").read_text()
    assert "Computed from this run" in report and "memory" in report
    scale = {row["system"]: row for row in results["scale_14b"]}  # 4 instances
    assert scale["kunserve"]["grows"] >= 1 and scale["kunserve"]["drops"] >= 2
    assert len(results["ablation"]) == 6 and results["p99_ttft_multiples"]
    full, flat = results["ablation"][4], results["ablation"][5]  # the seq_scale switch
    assert "not scaled" in flat["variant"] and flat["p99_ttft_s"] != full["p99_ttft_s"]
    assert any(row["claim"].startswith("group sequence budget") for row in results["paper_table"])


def test_burstgpt_shaped_trace_is_replayed_from_burstgpt_columns(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    specs = burstgpt_shaped(path, 4.0, 120.0, seed=0, intensity=3.0, share=0.3, cycle=120.0)
    assert path.read_text().startswith("Timestamp,Model,Request tokens,Response tokens")
    in_burst = [s for s in specs if s.arrival_time < 36.0]
    assert len(in_burst) > 0.6 * len(specs)  # 3x the rate over 30% of the cycle
    gaps = [b.arrival_time - a.arrival_time for a, b in zip(in_burst, in_burst[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv > 1.3  # Gamma gaps, burstier than Poisson
    longer = CHAT.scaled_output(3.0)
    assert longer.output[0] > CHAT.output[0] and longer.max_output == 3 * CHAT.max_output


def test_the_bound_is_measured_from_queueing_and_memory() -> None:
    memory = [(0.0, 0, 100), (1.0, 95, 100), (2.0, 95, 100), (3.0, 40, 100)]
    full = RunResult("vllm", [], [], [], memory, {}, 3.0, 0, waiting=[0, 5, 5, 5])
    assert bound_of(full) == ("memory", 2.0, 1.0)
    calm = RunResult("vllm", [], [], [], memory, {}, 3.0, 0, waiting=[0, 0, 0, 0])
    assert bound_of(calm)[0] == "nothing"


def test_queueing_at_the_sequence_budget_is_told_apart_from_memory_and_compute() -> None:
    memory = [(0.0, 0, 100), (1.0, 95, 100), (2.0, 50, 100), (4.0, 50, 100)]
    result = RunResult("kunserve", [], [], [], memory, {}, 4.0, 0, waiting=[0, 5, 5, 5],
                       running=[0, 400, 512, 300], seq_caps=[512, 512, 512, 512])
    assert result.bound_seconds() == {"memory": 1.0, "sequences": 1.0, "compute": 2.0}
    assert result.queued_seconds() == (1.0, 3.0)
    text = binding_text(result)
    assert "1 s at the sequence budget" in text and text.endswith("compute bound longest")


def test_the_sampler_leaves_a_grouped_members_unused_pool_out() -> None:
    from types import SimpleNamespace

    from andante.cluster.load import LoadReport
    from andante.engine.stats import SchedulerStats
    from experiments.kunserve_runs import MemorySampler

    def slot(blocks: int, free: int, running: int, member: bool, alive: bool) -> object:
        stats = SchedulerStats(time=1.0, num_blocks=blocks, num_free_blocks=free,
                               num_running=running, max_num_seqs=512)
        instance = SimpleNamespace(load=lambda: LoadReport(stats), is_member=member)
        return SimpleNamespace(instance=instance, alive=alive)

    leader = slot(37_000, 1_000, 600, member=False, alive=True)  # the group's blocks
    member = slot(14_000, 14_000, 0, member=True, alive=False)  # its own pool, unused
    sampler = MemorySampler()
    sampler.after_step(SimpleNamespace(slots=[leader, member], queue=[]))  # type: ignore[arg-type]
    assert sampler.samples == [(1.0, 36_000, 37_000)]
    assert (sampler.running, sampler.seq_caps) == ([600], [512])
    assert sampler.queued_blocks == [0]


def test_the_sampler_counts_the_routers_queue_in_the_demand() -> None:
    from types import SimpleNamespace

    from andante.cluster.load import LoadReport
    from andante.engine.stats import SchedulerStats
    from experiments.kunserve_runs import MemorySampler

    stats = SchedulerStats(time=1.0, num_blocks=100, num_free_blocks=0,
                           num_queued_kv_blocks=5)
    slot = SimpleNamespace(instance=SimpleNamespace(load=lambda: LoadReport(stats)),
                           alive=True)
    queued = [SimpleNamespace(num_prompt_tokens=33), SimpleNamespace(num_prompt_tokens=16)]
    sampler = MemorySampler(block_size=16)
    sampler.after_step(SimpleNamespace(slots=[slot], queue=queued))  # type: ignore[arg-type]
    assert sampler.queued_blocks == [5 + 3 + 1]  # the router's prompts: 33 -> 3, 16 -> 1


def test_slo_violations_are_split_into_ttft_and_tpot_causes() -> None:
    best = RunResult("vllm", [1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1, 0.1], [0.0] * 4, [], {},
                     1.0, 0)
    other = RunResult("kunserve", [1.0, 9.0, 1.0, 1.0], [0.1, 0.9, 0.5, math.nan], [0.0] * 4,
                      [], {}, 1.0, 0)
    causes = slo_causes([best, other], 2)
    assert causes == {"vllm": (0.0, 0.0), "kunserve": (0.25, 0.25)}
    shares = slo_violations([best, other], [2])
    assert shares["kunserve"] == [sum(causes["kunserve"])]  # the same requests, split
    assert "kunserve 25% TTFT + 25% TPOT only" in slo_text([best, other], [2])
    assert "the best P50 of the 2 systems run here" in slo_text([best, other], [2])


def test_exchange_text_compares_the_link_time_with_the_tail_of_the_same_run() -> None:
    unco = RunResult("kunserve", [10.0] * 10, [], [], [], {"num_drops": 2,
                                                           "exchange_ms": 3000}, 1.0, 0)
    assert exchange_text(unco) == ("uncoordinated: 2 exchanges held the link 3.0 s in all, "
                                   "1.50 s each; its P99 TTFT 10.00 s: the stall is 15.0% "
                                   "of it")


def test_peak_demand_is_set_against_what_the_deepest_drop_holds() -> None:
    memory = [(0.0, 50, 100), (1.0, 100, 130), (2.0, 60, 130)]
    kun = RunResult("kunserve", [], [], [], memory, {}, 2.0, 0, queued_blocks=[0, 80, 0],
                    headroom={2: 1.29})
    assert kun.peak_demand() == 1.8  # (100 in use + 80 queued) / 100 undropped
    assert "1.80x" in headroom_text(kun) and "memory binds after the deepest drop" \
        in headroom_text(kun)
    headroom = drop_headroom(base_spec("qwen2.5-72b", "h100-80g", 4, 4))
    assert sorted(headroom) == [2, 3, 4] and 1.0 < headroom[2] < headroom[3] < headroom[4]


def test_a_shrink_does_not_end_a_groups_life() -> None:
    from types import SimpleNamespace

    from andante.sim.kunserve import GroupEvent
    from experiments.kunserve_runs import _group_lifetimes

    events = [GroupEvent(1.0, "form", (0, 1)), GroupEvent(3.0, "form", (0, 1, 2), grow=True),
              GroupEvent(6.0, "shrink", (0, 1, 2))]
    router = SimpleNamespace(counters=SimpleNamespace(groups=SimpleNamespace(events=events)))
    assert _group_lifetimes(router, 10.0) == ([2.0, 7.0], 1)  # the pair, then the grown one
