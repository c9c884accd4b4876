"""KunServe on the simulator: the group sequence budget's ablation switch (`seq_scale`).
On, a group's sequence budget grows with its KV blocks per member (the paper: a drop
lets queued requests "be served with a larger batch size"); off, each microbatch slot
keeps one instance's budget, so a group whose sequence cap binds runs fewer requests."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from andante.cluster.controller import Controller
from andante.cluster.kunserve.router import settings_from
from andante.sim.setup import build_simulator
from andante.workload.spec import RequestSpec, to_requests
from tests.sim.test_kunserve import _spec


@dataclass
class PeakRunning:
    """A cluster operator recording the most requests a group's leader ran at once."""

    peak: int = 0
    caps: set[int] = field(default_factory=set)

    def after_step(self, controller: Controller) -> None:
        for slot in controller.slots:
            inst = slot.instance
            if getattr(inst, "grouped", False):
                stats = inst.load().stats
                self.peak = max(self.peak, stats.num_running)
                self.caps.add(stats.max_num_seqs)


def _run(seq_scale: bool) -> tuple[PeakRunning, list[float], dict[str, int]]:
    # short prompts and answers: many sequences fit the KV, so the sequence cap binds
    sim = build_simulator(_spec(seq_scale=seq_scale, restore_window_seconds=0.0))
    peak = PeakRunning()
    sim.controller.operators.append(peak)  # type: ignore[arg-type]
    specs = [RequestSpec(0.002 * i, 200, 200) for i in range(600)]
    requests = to_requests(specs)
    report = sim.run(requests)
    assert not report.unfinished
    for inst in sim.instances:
        inst.engine.scheduler.kv.check_invariants()
    ttft = [r.timeline.token_times[0] - r.arrival_time for r in requests]
    return peak, ttft, report.router_counters


def test_seq_scale_switch_changes_the_groups_batch_and_the_result() -> None:
    on, ttft_on, counters_on = _run(True)
    off, ttft_off, counters_off = _run(False)
    assert counters_on["num_drops"] >= 1 and counters_off["num_drops"] >= 1
    assert max(off.caps) == 2 * 128  # one instance's budget per pipeline slot
    assert max(on.caps) > max(off.caps)  # scaled by the group's blocks per member
    assert on.peak > max(off.caps) >= off.peak  # the larger batch is used
    assert ttft_on != ttft_off


def test_seq_scale_option_is_parsed() -> None:
    assert settings_from({}).seq_scale
    assert not settings_from({"seq_scale": "false"}).seq_scale
    with pytest.raises(ValueError):
        settings_from({"seq_scale": "maybe"})
