"""EDF over request groups: the plan generator's fallback (QLM §A.3) and incumbent (§7).

Design note. When the §7 program gives no plan meeting the chance constraints, QLM falls
back to earliest-deadline-first over groups and, when that misses the SLOs too, asks for
more capacity (§A.3). `edf_queues` is that list scheduling: groups in deadline order
(ties by id), each appended to the allowed instance that frees up first by mean times,
a model switch costing the instance's swap-in time. The plan generator also hands the
EDF plan to HiGHS as its starting incumbent and lets groups beyond its horizon follow
the program's queues by the same list scheduling (andante.cluster.qlm.planner).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from andante.cluster.qlm.plan_problem import PlanProblem, is_model_switch


def edf_order(problem: PlanProblem) -> list[int]:
    """Group indices by deadline (ties by id)."""
    return sorted(range(len(problem.group_ids)),
                  key=lambda i: (problem.slo[i], problem.group_ids[i]))


def edf_queues(problem: PlanProblem, start: Sequence[Sequence[int]] | None = None,
               groups: Sequence[int] | None = None) -> list[list[int]]:
    """§A.3 fallback: groups by deadline, each onto the allowed instance that frees up
    first (mean times, model switches included). `start` are queues to extend and
    `groups` the indices to place (default: every group, on empty queues)."""
    g = len(problem.instance_ids)
    drain = problem.drain.mean(axis=2).tolist()
    swap, on_device = problem.swap_in.tolist(), problem.on_device.tolist()
    queues = [list(q) for q in start] if start is not None else [[] for _ in range(g)]
    free = problem.base.astype(float).tolist()
    last: list[int | None] = [None] * g
    for gi, queue in enumerate(queues):
        for i in queue:
            free[gi], last[gi] = _after(problem, drain, swap, on_device, gi, i, free[gi],
                                        last[gi])
    todo = edf_order(problem) if groups is None else sorted(
        groups, key=lambda i: (problem.slo[i], problem.group_ids[i]))
    for i in todo:
        choices = []
        for gi in np.flatnonzero(problem.allowed[i]).tolist():
            finish, model = _after(problem, drain, swap, on_device, gi, i, free[gi], last[gi])
            choices.append((finish, gi, model))
        finish, best, model = min(choices)
        free[best], last[best] = finish, model
        queues[best].append(i)
    return queues


def _after(problem: PlanProblem, drain: list[list[float]], swap: list[list[float]],
           on_device: list[list[bool]], g: int, i: int, free: float, last: int | None
           ) -> tuple[float, int]:
    """(mean time instance g is done with group i appended, the model it then holds)."""
    m = int(problem.group_model[i])
    switch = is_model_switch(on_device[g][m], last, m)
    return free + (swap[g][m] if switch else 0.0) + drain[i][g], m
