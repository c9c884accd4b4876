"""A simulated cyclic burst (Andes §6.3) on Llama-3.1-70B / 8×A100: andes beats vllm."""

from __future__ import annotations

from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import build_workload
from andante.workload.builder import WorkloadConfig


def test_andes_beats_vllm_on_mean_qoe_in_a_burst() -> None:
    workload = build_workload(WorkloadConfig(
        kind="burst", rate=1.6, burst_intensity=2.5, burst_share=0.35, cycle_length=240,
        num_requests=None, duration=240, max_context=8192, seed=0))
    qoe = {}
    for policy in ("vllm", "andes"):
        spec = ClusterSpec(model="llama-3.1-70b", hardware="a100-40g", tp=8, policy=policy,
                           scheduler=SchedulerConfig(max_model_len=8192))
        run = simulate(spec, workload)
        assert run.summary.num_finished == len(workload)
        qoe[policy] = run.summary.qoe.mean
    assert qoe["andes"] > qoe["vllm"] + 0.1
