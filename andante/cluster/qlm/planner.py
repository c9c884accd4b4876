"""Plan generator (QLM §7, eqs. 6-13; fallback of §A.3).

Design note. The plan assigns every request group to a position of one virtual queue by
the §7 mixed-integer program (andante.cluster.qlm.milp), solved by HiGHS with a
deterministic budget (andante.cluster.qlm.highs_solver) over the problem that
andante.cluster.qlm.plan_problem samples from the estimator (§6).

Simplifications for scale, all options: each queue has L positions, L = ⌈slack × fair
share⌉ + 1 instead of the paper's L = #groups; the program orders only the
`horizon_groups` most urgent groups (by deadline) and the others follow them by EDF list
scheduling; HiGHS starts from the EDF plan, so a budget-limited answer is never worse
than EDF. A group that cannot meet its chance constraint is relaxed at a penalty instead
of making the program infeasible (andante.cluster.qlm.plan_problem), so the program
always has a plan: the plan generator decides whenever the solver returns one (the
program's, or EDF's order when that scores better by eq. 13 and the penalties), and says
that more capacity is needed when its plan still relaxes a group (§A.3). Only when the
solver returns no solution at all (its budget spent before any incumbent) does the plan
fall back to EDF over groups (list scheduling onto the instance that frees up first).
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
    objective: float  # eq. 13 of this plan, Σ E[ct − slo] (+ switch weights, penalties)
    feasible: bool  # every group meets its SAA chance constraint
    fallback: bool  # the solver returned nothing: EDF over groups (§A.3)
    needs_capacity: bool  # the plan relaxes some group's chance constraint (§A.3)
    status: str  # optimal, work_limit (the budget bound), infeasible, time_limit (opt-in), ...
    reason: str
    source: str = "milp"  # "milp", or "edf" when the EDF plan was kept
    missed: int = 0  # groups whose chance constraint the plan relaxes


def _plan(p: PlanProblem, queues: Sequence[Sequence[int]], ev: Evaluation, *, fallback: bool,
          needs_capacity: bool, status: str, reason: str, source: str = "milp") -> Plan:
    vqs = tuple(VirtualQueue(p.instance_ids[g], tuple(p.group_ids[i] for i in q))
                for g, q in enumerate(queues))
    return Plan(vqs, ev.objective, ev.feasible, fallback, needs_capacity, status, reason,
                source, ev.missed)


def _solve_milp(p: PlanProblem, options: PlannerOptions) -> tuple[str, list[list[int]] | None]:
    """HiGHS on the §7 program, seeded with the EDF plan when its queues fit the layout."""
    model = build_milp(p, options, queue_length(p, options))
    edf = edf_queues(p)
    seed_ok = all(len(q) <= model.layout.length for q in edf)
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
    ev, queues = min(scored, key=lambda e: e[0].objective)
    return status, queues, ev


def solve_problem(p: PlanProblem, options: PlannerOptions) -> Plan:
    """Solve the §7 program with HiGHS; EDF over groups only when it returns nothing.

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
    if ev is None or queues is None:
        return _plan(p, edf, edf_ev, fallback=True, needs_capacity=not edf_ev.feasible,
                     status=status, reason=f"plan generator: {status} over {scope}, no "
                     "solution; fell back to EDF over groups" + _capacity(edf_ev), source="edf")
    if ev.objective <= edf_ev.objective + 1e-9:
        return _plan(p, queues, ev, fallback=False, needs_capacity=not ev.feasible,
                     status=status, reason=f"plan generator: {status} over {scope}"
                     + _capacity(ev))
    return _plan(p, edf, edf_ev, fallback=False, needs_capacity=not edf_ev.feasible,
                 status=status, reason=f"plan generator: {status} over {scope}; EDF's plan "
                 "scores better, kept" + _capacity(edf_ev), source="edf")


def _capacity(ev: Evaluation) -> str:
    """§A.3: the plan's word when it gives up some groups' SLOs."""
    if ev.feasible:
        return ""
    return (f"; {ev.missed} group(s) cannot meet their SLO with probability Δ: more "
            "capacity is needed")


def generate_plan(groups: Sequence[RequestGroup], views: Sequence[InstanceView],
                  estimator: RCTEstimator, now: float,
                  options: PlannerOptions | None = None) -> Plan:
    """Estimate (§6) and plan (§7) in one call."""
    opts = options if options is not None else PlannerOptions()
    return solve_problem(build_problem(groups, views, estimator, now, opts), opts)
