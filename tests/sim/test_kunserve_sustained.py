"""KunServe under sustained load on long prompts (issue 30 item 6): it never does worse
than its own baseline (least-loaded vLLM), and a group whose dropped memory lies idle
restores."""

from __future__ import annotations

import numpy as np

from andante.cluster.kunserve.monitor import MonitorOptions, Watches, unmet_demand
from andante.core.request import Request, RequestStatus
from andante.engine.config import SchedulerConfig
from andante.engine.stats import SchedulerStats
from andante.sim.setup import build_simulator
from andante.sim.spec import ClusterSpec
from andante.workload.spec import RequestSpec, to_requests


def _long_prompt_replay(rate: float = 1.8, num: int = 600) -> list[RequestSpec]:
    """arXiv-summarisation-like lengths (prompts ~9k tokens, answers ~250), Poisson."""
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(1 / rate, num))
    prompts = np.clip(rng.lognormal(np.log(9000), 0.6, num), 1000, 30000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(250), 0.5, num), 16, 1000).astype(int)
    return [RequestSpec(float(t), int(p), int(o))
            for t, p, o in zip(times, prompts, outputs, strict=True)]


def _run(router: str, specs: list[RequestSpec]) -> tuple[list[Request], dict[str, int]]:
    spec = ClusterSpec(
        model="llama-3.1-8b", hardware="a100-40g", num_instances=4, router=router,
        scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256,
                                  max_model_len=32768))
    requests = to_requests(specs)
    report = build_simulator(spec).run(requests)
    assert not report.unfinished
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
    return requests, dict(report.router_counters)


def _ttft(requests: list[Request], q: float) -> float:
    return float(np.percentile([r.timeline.token_times[0] - r.arrival_time
                                for r in requests], q))


def test_long_prompts_at_a_load_least_loaded_handles_cost_kunserve_nothing() -> None:
    specs = _long_prompt_replay()
    base, _ = _run("least-loaded", specs)
    kun, counters = _run("kunserve", specs)
    assert _ttft(base, 99) < 10  # the baseline handles this load
    # (before the fix: 3 drops, P99 TTFT 53 s against 4.6 s; since every simulated prompt
    # has content of its own (issue 30 item 4) the baseline's p99 is 4.39 s and KunServe's,
    # its one drop and restore included, 4.66 s: within 10%, no collapse)
    assert _ttft(kun, 99) <= 1.10 * _ttft(base, 99)
    assert _ttft(kun, 50) <= 1.05 * _ttft(base, 50)
    assert counters["num_restores"] == counters["num_drops"]  # no group outlives the load


def _stats(used: int, queued: int, waiting: int, blocks: int = 1000) -> SchedulerStats:
    return SchedulerStats(num_blocks=blocks, num_free_blocks=blocks - used, num_running=10,
                          num_waiting=waiting, num_queued_kv_blocks=queued)


def test_a_long_queue_counts_only_within_the_horizon() -> None:
    options = MonitorOptions(decode_tokens=0, queue_horizon_tokens=1600)
    # 100 blocks free, a queue of 5000 blocks of long prompts: only 100 blocks count
    assert unmet_demand(_stats(900, 5000, 20), 16, options) == 0
    assert unmet_demand(_stats(950, 5000, 20), 16, options) == 50
    uncapped = MonitorOptions(decode_tokens=0, queue_horizon_tokens=0)
    assert unmet_demand(_stats(900, 5000, 20), 16, uncapped) == 4900


def test_a_group_with_idle_dropped_memory_restores_under_sustained_load() -> None:
    options = MonitorOptions(min_group_seconds=2.0, idle_restore_seconds=2.0, restore_fit=0.9,
                             queue_horizon_tokens=1600, restore_window_seconds=0.0)
    watches = Watches()
    base = 1000  # one instance's blocks without drop; the group has 2400
    busy = _stats(1500, 5000, 30, blocks=2400)  # 1500 in use < 0.9 x 2 x 1000, queue long
    assert not watches.restore_due(0, busy, base, 0.0, options, 2, 16)
    assert not watches.restore_due(0, busy, base, 1.0, options, 2, 16)  # too young
    assert watches.restore_due(0, busy, base, 2.5, options, 2, 16)
    assert watches.idle_memory(0)
    pressed = _stats(1850, 5000, 30, blocks=2400)  # 1850 > 1800: the dropped memory used
    other = Watches()
    assert not any(other.restore_due(1, pressed, base, t, options, 2, 16)
                   for t in (0.0, 3.0, 6.0))


def test_a_restore_window_keeps_the_group_until_its_dropped_memory_stays_idle() -> None:
    options = MonitorOptions(min_group_seconds=2.0, idle_restore_seconds=2.0,
                             restore_window_seconds=20.0)
    assert MonitorOptions().restore_window_seconds == 60.0  # the default (module note)
    watches = Watches()
    base = 1000
    peak = _stats(2200, 0, 0, blocks=2400)  # the burst uses the dropped memory
    lull = _stats(300, 0, 0, blocks=2400)  # 30% of one instance, nothing queued
    assert not watches.restore_due(0, peak, base, 0.0, options, 2, 16)
    # the paper's rule (usage <= 50%, idle queue) and the idle rule would restore at 3 s
    assert not any(watches.restore_due(0, lull, base, t, options, 2, 16)
                   for t in (1.0, 3.0, 10.0, 20.0))
    assert not watches.restore_due(0, peak, base, 21.0, options, 2, 16)  # the next clump
    assert not watches.restore_due(0, lull, base, 22.0, options, 2, 16)
    assert watches.restore_due(0, lull, base, 42.5, options, 2, 16)  # idle for 20 s
    without = Watches()
    plain = MonitorOptions(min_group_seconds=2.0, idle_restore_seconds=2.0,
                           restore_window_seconds=0.0)
    without.restore_due(0, peak, base, 0.0, plain, 2, 16)
    assert without.restore_due(0, lull, base, 3.0, plain, 2, 16)
