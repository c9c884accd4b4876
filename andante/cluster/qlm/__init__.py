"""QLM's pure-logic core (Patke et al., "One Queue Is All You Need"): request groups (§4),
the request completion time estimator (§6), virtual queues and the LSO decisions that
follow from them (§4-5), and the plan generator (§7, MILP with HiGHS;
its problem, program, solver and EDF fallback in modules of their own).

Nothing here reads a clock or does I/O: time comes in as arguments. The input value
types (`QueuedRequest`, `InstanceView`) are this package's own, to be adapted from
`andante.core.request.Request` and the cluster's instance reports by the caller.
"""

from andante.cluster.qlm.edf_plan import edf_queues
from andante.cluster.qlm.estimator import (
    CostModelTable,
    ExecutionCost,
    OutputLengthModel,
    RCTEstimator,
    r_squared,
)
from andante.cluster.qlm.groups import GroupKey, GroupTable, RequestGroup, form_groups
from andante.cluster.qlm.plan_problem import (
    PlannerOptions,
    PlanProblem,
    build_problem,
    evaluate_queues,
)
from andante.cluster.qlm.planner import Plan, generate_plan, solve_problem
from andante.cluster.qlm.types import InstanceView, QueuedRequest
from andante.cluster.qlm.virtual_queue import (
    ModelActions,
    PreemptionChoice,
    VirtualQueue,
    choose_preemption,
    head_change_preemptions,
    model_actions,
    pull_requests,
)

__all__ = [
    "CostModelTable",
    "ExecutionCost",
    "GroupKey",
    "GroupTable",
    "InstanceView",
    "ModelActions",
    "OutputLengthModel",
    "Plan",
    "PlanProblem",
    "PlannerOptions",
    "PreemptionChoice",
    "QueuedRequest",
    "RCTEstimator",
    "RequestGroup",
    "VirtualQueue",
    "build_problem",
    "choose_preemption",
    "edf_queues",
    "evaluate_queues",
    "form_groups",
    "generate_plan",
    "head_change_preemptions",
    "model_actions",
    "pull_requests",
    "r_squared",
    "solve_problem",
]
