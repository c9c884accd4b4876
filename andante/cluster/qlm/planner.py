"""Plan generator (QLM §7, eqs. 6-13; fallback of §A.3).

Design note. The plan assigns every request group to a position of one virtual queue by
the §7 mixed-integer program (andante.cluster.qlm.milp), solved by HiGHS with a
deterministic budget (andante.cluster.qlm.highs_solver) over the problem that
andante.cluster.qlm.plan_problem samples from the estimator (§6).

Simplifications for scale, all options: each queue has L positions, L = ⌈slack × fair
share⌉ + 1 instead of the paper's L = #groups; the program orders only the
`horizon_groups` most urgent groups (by deadline) and the others follow them by EDF list
scheduling; HiGHS starts from the EDF plan when that meets the chance constraints, so a
budget-limited answer is never worse than EDF. If there is no plan meeting the chance
constraints (infeasible, or no solution within the budget), the plan falls back to EDF
over groups (list scheduling onto the instance that frees up first) and, when EDF does not
meet them either, says that more capacity is needed (§A.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from andante.cluster.qlm.edf_plan import edf_order, edf_queues
from andante.cluster.qlm.estimator import RCTEstimator
from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.highs_solver import run_highs
from andante.cluster.qlm.milp import build_milp, extract_queues, queue_length, start_values
from andante.cluster.qlm.plan_problem import (
    Evaluation,
    PlannerOptions,
    PlanProblem,
    build_problem,
    evaluate_queues,
    subproblem,
)
from andante.cluster.qlm.types import InstanceView
from andante.cluster.qlm.virtual_queue import VirtualQueue


@dataclass(frozen=True, slots=True)
class Plan:
    """The plan generator's answer: one virtual queue per instance, in instance order."""

    queues: tuple[VirtualQueue, ...]
    objective: float  # eq. 13 of this plan, Σ E[ct − slo] (+ switch weights)
    feasible: bool  # meets the SAA chance constraints
    fallback: bool  # the program gave no usable plan: EDF over groups (§A.3)
    needs_capacity: bool  # not even the fallback meets the chance constraints
    status: str  # optimal, work_limit (the budget bound), infeasible, time_limit (opt-in), ...
    reason: str
    source: str = "milp"  # "milp", or "edf" when the EDF plan was kept


def _plan(p: PlanProblem, queues: Sequence[Sequence[int]], ev: Evaluation, *, fallback: bool,
          needs_capacity: bool, status: str, reason: str, source: str = "milp") -> Plan:
    vqs = tuple(VirtualQueue(p.instance_ids[g], tuple(p.group_ids[i] for i in q))
                for g, q in enumerate(queues))
    return Plan(vqs, ev.objective, ev.feasible, fallback, needs_capacity, status, reason,
                source)


def _solve_milp(p: PlanProblem, options: PlannerOptions) -> tuple[str, list[list[int]] | None]:
    """HiGHS on the §7 program, seeded with the EDF plan when that meets the constraints."""
    model = build_milp(p, options, queue_length(p, options))
    edf = edf_queues(p)
    seed_ok = (evaluate_queues(p, edf, options).feasible
               and all(len(q) <= model.layout.length for q in edf))
    status, x = run_highs(model, options, start_values(p, model.layout, edf) if seed_ok
                          else None)
    return status, None if x is None else extract_queues(x, model.layout)


def _solve_horizon(p: PlanProblem, options: PlannerOptions, horizon: int,
                   edf: Sequence[Sequence[int]]
                   ) -> tuple[str, list[list[int]] | None, Evaluation | None]:
    """The program over the `horizon` most urgent groups; the others follow in deadline
    order, either list-scheduled again or on the instance EDF gave them (the better)."""
    order = edf_order(p)
    urgent, rest = order[:horizon], order[horizon:]
    status, head = _solve_milp(subproblem(p, urgent), options)
    if head is None:
        return status, None, None
    head = [[urgent[i] for i in q] for q in head]
    where = {i: g for g, q in enumerate(edf) for i in q}
    rest_set = set(rest)
    candidates = [edf_queues(p, head, rest),
                  [q + [i for i in order if i in rest_set and where[i] == g]
                   for g, q in enumerate(head)]]
    scored = [(evaluate_queues(p, c, options), c) for c in candidates]
    ev, queues = min(scored, key=lambda e: (not e[0].feasible, e[0].objective))
    return status, queues, ev


def solve_problem(p: PlanProblem, options: PlannerOptions) -> Plan:
    """Solve the §7 program with HiGHS; EDF over groups when it has no answer (§A.3).

    With more groups than `options.horizon_groups`, the program covers the most urgent
    ones (by deadline) and the rest follow them by EDF list scheduling.
    """
    n = len(p.group_ids)
    if n == 0:
        return _plan(p, [[] for _ in p.instance_ids], Evaluation(0.0, True, (), 0),
                     fallback=False, needs_capacity=False, status="empty", reason="no groups")
    edf = edf_queues(p)
    edf_ev = evaluate_queues(p, edf, options)
    horizon = options.horizon_groups
    if horizon is None or n <= horizon:
        status, queues = _solve_milp(p, options)
        scope = "all groups"
        ev = evaluate_queues(p, queues, options) if queues is not None else None
    else:
        status, queues, ev = _solve_horizon(p, options, horizon, edf)
        scope = f"the {horizon} most urgent of {n} groups, the rest by EDF"
    if ev is not None and queues is not None and ev.feasible and (
            not edf_ev.feasible or ev.objective <= edf_ev.objective + 1e-9):
        return _plan(p, queues, ev, fallback=False, needs_capacity=False, status=status,
                     reason=f"plan generator: {status} over {scope}")
    if ev is not None and ev.feasible:  # a usable plan, but EDF's whole queue scores better
        return _plan(p, edf, edf_ev, fallback=False, needs_capacity=False, status=status,
                     reason=f"plan generator: {status} over {scope}; EDF's plan scores "
                            "better, kept", source="edf")
    reason = (f"plan generator: {status} over {scope}, no plan meeting the chance "
              "constraints; fell back to EDF over groups"
              + ("; more capacity is needed to meet the SLOs" if not edf_ev.feasible else ""))
    return _plan(p, edf, edf_ev, fallback=True, needs_capacity=not edf_ev.feasible,
                 status=status, reason=reason, source="edf")


def generate_plan(groups: Sequence[RequestGroup], views: Sequence[InstanceView],
                  estimator: RCTEstimator, now: float,
                  options: PlannerOptions | None = None) -> Plan:
    """Estimate (§6) and plan (§7) in one call."""
    opts = options if options is not None else PlannerOptions()
    return solve_problem(build_problem(groups, views, estimator, now, opts), opts)
