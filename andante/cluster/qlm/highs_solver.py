"""HiGHS on the plan generator's program, with a deterministic budget (QLM §7).

Design note (reproducibility). The solver's budget is a deterministic work measure, not
wall-clock time: at most `max_nodes` branch-and-bound nodes and `work_limit` of HiGHS's
own limit checks (its MIP interrupt callback, which it reaches at fixed points of its
single-threaded search: root cut rounds, heuristics, nodes), with a fixed `random_seed`.
The same inputs therefore give the same plan on a busy and an idle machine, even when the
budget binds (status "work_limit"). A wall-clock `time_limit_s` exists as an opt-in
safety net; a plan it cuts short depends on the machine's speed.
"""

from __future__ import annotations

import functools
import os
import sys

import highspy
import numpy as np

from andante.cluster.qlm.milp import Milp
from andante.cluster.qlm.plan_problem import PlannerOptions


@functools.cache
def quiet_first_highs() -> None:
    """HiGHS writes its banner to fd 1 (from C++) when the process builds its first
    solver, before any option can be set; build that one with fd 1 on the null device so
    JSON printed on stdout stays clean. Later solvers print nothing (output_flag off)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


_STATUS = {highspy.HighsModelStatus.kOptimal: "optimal",
           highspy.HighsModelStatus.kInfeasible: "infeasible",
           highspy.HighsModelStatus.kInterrupt: "work_limit",
           highspy.HighsModelStatus.kSolutionLimit: "work_limit",  # max_nodes reached
           highspy.HighsModelStatus.kTimeLimit: "time_limit"}


def _solver(options: PlannerOptions) -> highspy.Highs:
    """A quiet single-threaded HiGHS with the plan's deterministic budget (module note)."""
    quiet_first_highs()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", int(options.seed) % (2**31))
    h.setOptionValue("mip_rel_gap", float(options.mip_rel_gap))
    h.setOptionValue("mip_max_nodes", int(options.max_nodes))
    if options.time_limit_s is not None:
        h.setOptionValue("time_limit", float(options.time_limit_s))
    checks = [0]

    def interrupt(_kind: highspy.cb.HighsCallbackType, _message: str,
                  _out: highspy.cb.HighsCallbackOutput, data_in: highspy.cb.HighsCallbackInput,
                  _user: object) -> None:
        checks[0] += 1
        if checks[0] > options.work_limit:
            data_in.user_interrupt = True

    h.setCallback(interrupt, None)
    h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    return h


def run_highs(model: Milp, options: PlannerOptions, start: np.ndarray | None
               ) -> tuple[str, np.ndarray | None]:
    """Solve with HiGHS from an optional incumbent; ('optimal'|'work_limit'|..., x)."""
    h = _solver(options)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(model.cost), len(model.row_lower)
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.cost, model.lower, model.upper
    lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = model.matrix
    lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
                       for flag in model.integrality]
    h.passModel(lp)
    if start is not None:
        solution = highspy.HighsSolution()
        solution.col_value = start.tolist()
        solution.value_valid = True
        h.setSolution(solution)
    h.run()
    status = h.getModelStatus()
    has_x = h.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if has_x else None
    return _STATUS.get(status, h.modelStatusToString(status)), x
