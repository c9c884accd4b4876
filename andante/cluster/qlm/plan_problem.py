"""The plan generator's input and how a plan scores (QLM §6-7: eqs. 2, 5, 10-13).

Design note. `build_problem` turns request groups and instance views into the numbers of
the §7 program: per group and instance, S sample-average-approximation (SAA) samples of
the group's drain time (its Σ O / Θ, eq. 2) and completion time (eq. 5), drawn from the
estimator (§6) with output lengths common to every instance (common random numbers), the
model-load time per (instance, model) (the estimator's warm or cold swap-in: a
refinement of the paper's constant S), what is on each device now, the time to drain
the running batch, and which instances a group fits (its model's weights within the
device memory). `evaluate_queues` scores any ordering of groups onto virtual queues by
eqs. 10-13 sample by sample: its mean completion times, the eq. 13 objective and whether
each position meets the chance constraint of eq. 12 (at most k = ⌊(1 − Δ)·S⌋ of the S
samples late; S is chosen so that k ≥ 1, as the SAA form of a chance constraint needs,
else one unlucky sample makes a group infeasible). A group that cannot meet its chance
constraint wherever it is placed (hopeless: more capacity is needed, §A.3) must not make
the whole program infeasible: its constraint is relaxed at a penalty (`miss_penalty`,
larger than any lateness a group can have), so the program first keeps as many groups
as it can within their SLOs and then minimises eq. 13; the evaluator counts the groups
it relaxed (`Evaluation.missed`). The MILP (andante.cluster.qlm.milp), the EDF fallback
(andante.cluster.qlm.edf_plan) and the plan generator (andante.cluster.qlm.planner) all
read this problem and score with this evaluator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from andante.cluster.qlm.estimator import RCTEstimator
from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.types import InstanceView, check_non_negative, check_positive

# A completion time within this of its SLO counts as meeting it (HiGHS's feasibility
# tolerance is 1e-7 on rows carrying big-M terms).
SLO_TOLERANCE_S = 1e-6


@dataclass(frozen=True, slots=True)
class PlannerOptions:
    """The paper's knobs (§4 δ, §7 Δ and S), the penalty weights and the solver's limits.

    `delta` is for the caller's grouping (`GroupTable.snapshot(avg_batch, options.delta)`);
    The SAA chance constraint allows k = ⌊(1 − Δ)·S⌋ late samples per group: S must be
    large enough that k ≥ 1 for Δ < 1 (S = 10 with Δ = 0.9), otherwise every sample
    would have to meet every SLO (a ValueError says so). `miss_weight` scales the penalty
    of a group relaxed past its chance constraint (module note).
    """

    delta: float = 4.0  # group size cap, in average batches (§4, §8.3)
    num_samples: int = 10  # S, SAA samples of the stochastic terms (k = ⌊(1 − Δ)·S⌋ ≥ 1)
    chance_level: float = 0.9  # Δ of eq. 12
    work_limit: int = 20  # HiGHS limit checks (MIP interrupt callbacks) before it stops
    max_nodes: int = 500  # branch-and-bound nodes before it stops
    time_limit_s: float | None = None  # opt-in wall-clock cap (breaks reproducibility)
    mip_rel_gap: float = 1e-4
    queue_slack: float = 1.5  # positions per queue, in fair shares of the groups
    max_queue_length: int | None = None  # overrides queue_slack when set
    horizon_groups: int | None = 12  # groups the program orders; None: all of them
    completion_weight: float = 1.0  # weight of eq. 13's Σ E[ct − slo]
    swap_weight: float = 0.0  # seconds-equivalent penalty per model switch
    miss_weight: float = 1.0  # penalty of a relaxed group, in `time_bounds` big-M units
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive("delta", self.delta)
        if self.time_limit_s is not None:
            check_positive("time_limit_s", self.time_limit_s)
        if self.work_limit < 1 or self.max_nodes < 1:
            raise ValueError(f"work_limit and max_nodes must be >= 1, got "
                             f"{self.work_limit!r}, {self.max_nodes!r}")
        check_positive("queue_slack", self.queue_slack)
        check_positive("completion_weight", self.completion_weight)
        check_non_negative("swap_weight", self.swap_weight)
        check_non_negative("mip_rel_gap", self.mip_rel_gap)
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples!r}")
        if not 0.0 < self.chance_level <= 1.0:
            raise ValueError(f"chance_level must be in (0, 1], got {self.chance_level!r}")
        if self.chance_level < 1.0 and self.allowed_violations < 1:
            need = math.ceil(1.0 / (1.0 - self.chance_level) - 1e-9)
            raise ValueError(
                f"num_samples={self.num_samples} with chance_level={self.chance_level:g} "
                f"allows floor((1 - chance_level) * num_samples) = 0 late samples: every "
                f"sample would have to meet every SLO; use num_samples >= {need} "
                f"(or chance_level=1.0)")
        check_positive("miss_weight", self.miss_weight)
        if self.horizon_groups is not None and self.horizon_groups < 1:
            raise ValueError(f"horizon_groups must be >= 1, got {self.horizon_groups!r}")
        if self.max_queue_length is not None and self.max_queue_length < 1:
            raise ValueError(f"max_queue_length must be >= 1, got {self.max_queue_length!r}")

    @property
    def allowed_violations(self) -> int:
        """k of the SAA chance constraint: samples per position allowed to miss the SLO."""
        return math.floor((1.0 - self.chance_level) * self.num_samples + 1e-9)


@dataclass(frozen=True, slots=True)
class PlanProblem:
    """The planner's numeric input; times in seconds from now.

    drain/completion: [N groups, G instances, S samples]; swap_in: [G, M models];
    on_device: [G, M]; base: [G] (time to drain what runs now); allowed: [N, G].
    """

    group_ids: tuple[str, ...]
    instance_ids: tuple[str, ...]
    models: tuple[str, ...]
    group_model: np.ndarray
    slo: np.ndarray
    drain: np.ndarray
    completion: np.ndarray
    swap_in: np.ndarray
    on_device: np.ndarray
    base: np.ndarray
    allowed: np.ndarray

    def __post_init__(self) -> None:
        n, g, m = len(self.group_ids), len(self.instance_ids), len(self.models)
        if g < 1:
            raise ValueError(f"need at least one instance, got {g}")
        s = self.drain.shape[2] if self.drain.ndim == 3 else -1
        expected = {"group_model": (n,), "slo": (n,), "drain": (n, g, s), "completion": (n, g, s),
                    "swap_in": (g, m), "on_device": (g, m), "base": (g,), "allowed": (n, g)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, want {shape}")
        unplaceable = [self.group_ids[i] for i in range(n) if not self.allowed[i].any()]
        if unplaceable:
            raise ValueError(f"groups fit on no instance: {unplaceable}")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.group_ids), len(self.instance_ids), len(self.models),
                self.drain.shape[2])


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A plan's eq. 13 objective and whether it meets the SAA chance constraints."""

    objective: float  # eq. 13 plus the penalty of the relaxed groups
    feasible: bool  # every group meets its chance constraint (missed == 0)
    expected_completion: tuple[float, ...]  # per group index, seconds from now
    num_switches: int
    missed: int = 0  # groups past their chance constraint (relaxed at a penalty)


def build_problem(groups: Sequence[RequestGroup], views: Sequence[InstanceView],
                  estimator: RCTEstimator, now: float, options: PlannerOptions) -> PlanProblem:
    """Sample every group on every instance it fits (S samples, seeded by options.seed).

    Each group's output lengths are drawn once and shared by all instances (common random
    numbers), so the program compares instances on the same scenarios."""
    rng = np.random.default_rng(options.seed)
    n, g, s = len(groups), len(views), options.num_samples
    models = tuple(sorted({gr.model for gr in groups} | {m for v in views
                                                       for m in v.models_on_device}))
    index = {m: k for k, m in enumerate(models)}
    drain, completion = np.zeros((n, g, s)), np.zeros((n, g, s))
    memory = np.array([v.device_memory_bytes for v in views])
    allowed = np.array([estimator.weight_bytes(gr.model) <= memory for gr in groups],
                       dtype=bool).reshape(n, g)
    memo: dict[tuple[object, ...], Any] = {}  # the cost model's answers, shared
    for i, group in enumerate(groups):
        outputs = estimator.sample_outputs(group, s, rng)  # common to every instance
        fits = np.flatnonzero(allowed[i])
        drain[i, fits], completion[i, fits] = estimator.times_across(
            [views[k] for k in fits.tolist()], group, outputs, memo)
    swap_in = np.array([[estimator.swap_in_time(v, m) if m in estimator.model_bytes else 0.0
                         for m in models] for v in views]).reshape(g, len(models))
    on_device = np.array([[m in v.models_on_device for m in models] for v in views],
                         dtype=bool).reshape(g, len(models))
    return PlanProblem(
        group_ids=tuple(gr.group_id for gr in groups),
        instance_ids=tuple(v.instance_id for v in views), models=models,
        group_model=np.array([index[gr.model] for gr in groups], dtype=int),
        slo=np.array([gr.deadline - now for gr in groups], dtype=float),
        drain=drain, completion=completion, swap_in=swap_in, on_device=on_device,
        base=np.array([v.busy_s for v in views], dtype=float), allowed=allowed)


def time_bounds(problem: PlanProblem) -> tuple[float, float]:
    """(H, big_m): H bounds every busy time of a plan; big_m bounds any lateness
    (completion − SLO) a group can have, so it relaxes any chance row."""
    n = len(problem.group_ids)
    busy = (float(problem.base.max()) + float(problem.drain.max(axis=(1, 2)).sum())
            + n * float(problem.swap_in.max(initial=0.0)) + 1.0)
    slack = max(0.0, -float(problem.slo.min(initial=0.0)))
    return busy, busy + float(problem.completion.max(initial=0.0)) + slack + 1.0


def miss_penalty(problem: PlanProblem, options: PlannerOptions) -> float:
    """The objective's price of relaxing one group's chance constraint: more than any
    lateness a group can have, so a group is given up only when keeping it within its
    SLO is impossible or costs another group its SLO."""
    return options.miss_weight * time_bounds(problem)[1]


def is_model_switch(on_device: bool, previous: int | None, model: int) -> bool:
    """Eq. 9: serving `model` next switches the device's model when it differs from the
    previous group's, or, at the head of a queue, when it is not on the device now."""
    return (not on_device) if previous is None else model != previous


def evaluate_queues(problem: PlanProblem, queues: Sequence[Sequence[int]],
                    options: PlannerOptions) -> Evaluation:
    """Eqs. 10-13 for a given ordering (group indices per instance), sample by sample."""
    n, _, _, s = problem.shape
    if sorted(i for q in queues for i in q) != list(range(n)):
        raise ValueError(f"queues must place every group exactly once, got {queues!r}")
    mean_ct = np.zeros(n)
    missed, switches = 0, 0
    k = options.allowed_violations
    for g, queue in enumerate(queues):
        busy = np.full(s, problem.base[g])
        previous: int | None = None
        for i in queue:
            if not problem.allowed[i, g]:
                raise ValueError(f"group {problem.group_ids[i]!r} does not fit on "
                                 f"{problem.instance_ids[g]!r}")
            m = int(problem.group_model[i])
            switch = is_model_switch(bool(problem.on_device[g, m]), previous, m)
            busy = busy + (problem.swap_in[g, m] if switch else 0.0)
            ct = busy + problem.completion[i, g]
            busy = busy + problem.drain[i, g]
            switches += int(switch)
            mean_ct[i] = ct.mean()
            missed += int((ct > problem.slo[i] + SLO_TOLERANCE_S).sum()) > k
            previous = m
    objective = (options.completion_weight * float((mean_ct - problem.slo).sum())
                 + options.swap_weight * switches)
    if missed:
        objective += missed * miss_penalty(problem, options)
    return Evaluation(objective, missed == 0, tuple(mean_ct.tolist()), switches, missed)


def subproblem(problem: PlanProblem, indices: Sequence[int]) -> PlanProblem:
    """The same instances with only the groups at `indices` (in that order)."""
    idx = np.asarray(indices, dtype=int)
    return PlanProblem(
        tuple(problem.group_ids[i] for i in idx), problem.instance_ids, problem.models,
        problem.group_model[idx], problem.slo[idx], problem.drain[idx],
        problem.completion[idx], problem.swap_in, problem.on_device, problem.base,
        problem.allowed[idx])
