"""`andante experiment andes`: Andes §6 in the simulator.

Design note. Setups of §6.1 on simulated A100-40GB: Phi-3-mini on 4 GPUs (tp=4) and
Llama-3.1-70B on 8 (tp=8), ShareGPT lengths cut to the model's context, TTFT target
max(prompt/5000, 1 s), reading speeds from the workload module (Fig. 2 analogue).
The cycle's mean rate R is "the serving system's throughput without burstiness"
(§6.3), read as the highest Poisson rate at which vLLM keeps mean QoE >= 0.95 (found
by bisection; the quick run uses the full run's value). Figures: 15/16 (QoE vs burst
intensity/duration, 4 policies, both setups), 17-20 and Appendix A on Llama-70B as
§6.4, and the real-trace analogue (Azure conversation trace, scaled so that vLLM's
share of requests at QoE >= 0.95 is closest to the paper's 75 %, and at the heaviest
scale tried, where FCFS queues build up). "andes" here is the paper's prefill-first
Andes (`chunked_prefill=false`); the chunked-prefill section (andes_chunked.py)
compares it with andes-chunked and sarathi on long prompts, by prompt-length bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from andante.bench.report import Report
from andante.policies.andes import AndesOptions
from experiments import andes_chunked, andes_report
from experiments.andes_runs import (
    LLAMA,
    PHI,
    Job,
    Outcome,
    Setup,
    run_jobs,
    sustainable_rate,
)
from experiments.registry import ExperimentContext

POLICIES = ("vllm", "sarathi", "lqsf", "andes")
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "andes-norefiner": ("andes", {"refiner": False}),
    "andes-nobudget": ("andes", {"slack_percentile": 1.0}),
    "andes-dp": ("andes", {"solver": "dp", "dp_max_items": 128, "dp_capacity_units": 128}),
    "andes-min": ("andes", {"objective": "min"}),
    "andes-perfect": ("andes", {"objective": "perfect"}),
    "andes-chunked": ("andes", {"chunked_prefill": True}),
}
DEFAULT_INTENSITY, DEFAULT_SHARE = 2.0, 0.35  # BurstGPT statistics (§6.3)
STALL_WEIGHT = AndesOptions().stall_weight


@dataclass(frozen=True, slots=True)
class Plan:
    setups: tuple[Setup, ...]
    intensities: tuple[float, ...]
    shares: tuple[float, ...]
    ablation_shares: tuple[float, ...]
    dp_shares: tuple[float, ...]
    deltas: tuple[float, ...]
    poisson_loads: tuple[float, ...]  # multiples of R
    trace_seconds: float
    trace_scales: tuple[float, ...]  # candidates; vLLM's attainment picks one
    stall_weights: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0)  # refiner calibration
    rates: dict[str, float] = field(default_factory=dict)  # empty: calibrate
    long_prompt_rate: float = 1.0  # req/s of the chunked-prefill section's long prompts
    objectives: bool = True

    @property
    def ablation(self) -> Setup:
        return self.setups[-1]  # Llama-3.1-70B, as §6.4


FULL = Plan(setups=(PHI, LLAMA), intensities=(1.0, 1.25, 1.5, 2.0, 2.5, 2.75),
            shares=(0.1, 0.2, 0.35, 0.5), ablation_shares=(0.1, 0.2, 0.35, 0.5),
            dp_shares=(0.2, 0.35, 0.5), deltas=(1.0, 3.0, 10.0, 30.0, 100.0),
            poisson_loads=(0.8, 1.0, 1.2, 1.4), trace_seconds=1800.0,
            trace_scales=(0.7, 0.75, 0.8, 0.85, 0.9))
QUICK = Plan(setups=(replace(LLAMA, cycle=240.0),), intensities=(1.0, 2.5), shares=(0.35,),
             ablation_shares=(0.35,), dp_shares=(0.35,), deltas=(3.0, 10.0),
             poisson_loads=(1.2,), trace_seconds=300.0, trace_scales=(0.8,),
             stall_weights=(1.0, 10.0), rates={"llama70b": 1.82}, objectives=False)


def burst_key(setup: Setup, policy: str, intensity: float, share: float) -> str:
    return f"burst/{setup.key}/{policy}/I{intensity:g}/D{share:g}"


def variant(policy: str) -> tuple[str, dict[str, Any]]:
    """(registered policy, options) of a figure's policy name."""
    for prefix, option in (("andes-dt", "delta_t"), ("andes-sw", "stall_weight")):
        if policy.startswith(prefix):
            return "andes", {option: float(policy[len(prefix):])}
    return VARIANTS.get(policy, (policy, {}))


def _burst_job(setup: Setup, rate: float, policy: str, intensity: float, share: float,
               seed: int) -> Job:
    base, options = variant(policy)
    workload = setup.workload(rate=rate, burst_intensity=intensity, burst_share=share,
                              seed=seed)
    return Job(burst_key(setup, policy, intensity, share), setup.spec(base, options),
               workload, until=4.0 * setup.cycle)


def burst_points(plan: Plan) -> list[tuple[Setup, str, float, float]]:
    """Every (setup, policy, intensity, share) the figures need, without repeats."""
    points: list[tuple[Setup, str, float, float]] = []
    for s in plan.setups:
        points += [(s, p, i, DEFAULT_SHARE) for i in plan.intensities for p in POLICIES]
        points += [(s, p, DEFAULT_INTENSITY, d) for d in plan.shares for p in POLICIES]
    a = plan.ablation
    points += [(a, v, DEFAULT_INTENSITY, d) for d in plan.ablation_shares
               for v in ("andes-norefiner", "andes-nobudget")]
    points += [(a, "andes", DEFAULT_INTENSITY, d) for d in plan.ablation_shares]
    points += [(a, "andes-dp", DEFAULT_INTENSITY, d) for d in plan.dp_shares]
    points += [(a, "andes", DEFAULT_INTENSITY, d) for d in plan.dp_shares]
    points += [(a, f"andes-dt{dt:g}", DEFAULT_INTENSITY, DEFAULT_SHARE)
               for dt in plan.deltas if dt != 10.0]
    points += [(a, p, DEFAULT_INTENSITY, DEFAULT_SHARE) for p in POLICIES]
    points += [(a, sw_name(w), DEFAULT_INTENSITY, DEFAULT_SHARE) for w in plan.stall_weights]
    if plan.objectives:
        points += [(a, p, DEFAULT_INTENSITY, DEFAULT_SHARE)
                   for p in ("andes-min", "andes-perfect")]
    return list(dict.fromkeys(points))


def sw_name(weight: float) -> str:
    """The figure name of Andes with stall weight `weight` (the default is "andes")."""
    return "andes" if weight == STALL_WEIGHT else f"andes-sw{weight:g}"


def _poisson_jobs(plan: Plan, rate: float, seed: int) -> list[Job]:
    s = plan.ablation
    return [Job(f"poisson/{s.key}/{p}/{load:g}", s.spec(p),
                s.workload(kind="poisson", rate=load * rate, seed=seed),
                until=4.0 * s.cycle)
            for load in plan.poisson_loads for p in POLICIES]


def _trace_jobs(plan: Plan, scale: float, seed: int, policies: tuple[str, ...],
                detail: bool) -> list[Job]:
    s = plan.ablation
    workload = s.workload(kind="azure-conv", lengths="trace", rate_scale=scale,
                          duration=plan.trace_seconds, seed=seed)
    return [Job(f"trace/{s.key}/{p}/{scale:g}", s.spec(*variant(p)), workload, detail=detail)
            for p in policies]


def _calibrate(plan: Plan, seed: int) -> dict[str, dict[str, float]]:
    out = {}
    for s in plan.setups:
        if s.key in plan.rates:
            out[s.key] = {"rate": plan.rates[s.key], "saturated": float("nan")}
        else:
            rate, top = sustainable_rate(s, seed)
            out[s.key] = {"rate": rate, "saturated": top}
    return out


def _pick_scale(plan: Plan, seed: int) -> tuple[float, dict[str, Outcome]]:
    if len(plan.trace_scales) == 1:
        return plan.trace_scales[0], {}
    trials = run_jobs([j for sc in plan.trace_scales
                       for j in _trace_jobs(plan, sc, seed, ("vllm",), False)])
    attain = {sc: trials[f"trace/{plan.ablation.key}/vllm/{sc:g}"].summary["qoe_attainment"]
              for sc in plan.trace_scales}
    return min(attain, key=lambda sc: abs(attain[sc] - 0.75)), trials


def run(ctx: ExperimentContext) -> Report:
    plan = QUICK if ctx.quick else FULL
    rates = _calibrate(plan, ctx.seed)
    jobs = [_burst_job(s, rates[s.key]["rate"], p, i, d, ctx.seed)
            for s, p, i, d in burst_points(plan)]
    jobs += _poisson_jobs(plan, rates[plan.ablation.key]["rate"], ctx.seed)
    scale, trials = _pick_scale(plan, ctx.seed)
    scales = tuple(dict.fromkeys((scale, max(plan.trace_scales))))
    jobs += [j for sc in scales for j in _trace_jobs(plan, sc, ctx.seed, POLICIES, True)]
    weights = tuple(sw_name(w) for w in plan.stall_weights if sw_name(w) != "andes")
    jobs += _trace_jobs(plan, scale, ctx.seed, weights, False)
    jobs += andes_chunked.jobs(plan, plan.long_prompt_rate, ctx.seed, variant)
    jobs.sort(key=lambda j: (j.spec.model != "phi-3-mini", j.spec.policy == "vllm"))
    outcomes = run_jobs(jobs)
    report = Report(ctx.output_dir, "Andes: QoE-aware token-level scheduling, reproduced")
    andes_report.write(report, plan, rates, scales, outcomes, trials, quick=ctx.quick)
    return report
