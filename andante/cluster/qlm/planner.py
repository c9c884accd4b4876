"""Plan generator (QLM §7, eqs. 6-13; fallback of §A.3).

Design note. The plan assigns every request group to a position of one virtual queue and
is a mixed-integer program solved by HiGHS (highspy), following §7. Positions are counted
from the tail of each queue (k = the number of groups served after it), which keeps the
objective linear without big-M terms:
- x[g,k,i] ∈ {0,1}: group i at tail-position k of queue g; every group placed once and
  every position holding at most one group (eq. 6; the paper fills unused positions with
  "empty" groups, we leave them empty and keep them above the head:
  Σ_i x[g,k+1,i] ≤ Σ_i x[g,k,i]);
- model of a position and model switches (eqs. 7, 9), linearised per model m as
  t[g,k,m] ≥ a[g,k,m] − a[g,k+1,m] − on_device[g,m]·(1 − occupied[g,k+1]), a = Σ_{i∈m} x:
  the group served before the head is "whatever is on the device now". A switch into m
  costs swap_in[g,m], the estimator's warm (host) or cold (disk) load time: a
  per-(instance, model) refinement of the paper's constant conservative S;
- completion times (eq. 10) per SAA sample s: B[g,k,s] = B[g,k+1,s] + Σ_i drain[i,g,s]·x
  + Σ_m swap_in[g,m]·t (B above the head = the time to drain the running batch) is when
  queue g has served position k, and ct = B − drain + completion of the group there (drain
  = its Σ O / Θ, eq. 2; completion = eq. 5);
- chance constraint P(ct − slo ≤ 0) ≥ Δ (eqs. 11-12) by sample-average approximation
  (Luedtke & Ahmed 2008): per position at most k = ⌊(1 − Δ)·S⌋ of the S samples may
  violate, with binaries z[g,k,s] and big-M; k = 0 needs no binaries (every sample meets);
- objective (eq. 13): min Σ E[ct − slo] = Σ E[ct] − Σ slo. With tail positions, a group at
  position k delays the k groups behind it and a switch there delays k + 1 groups, so
  Σ E[ct] = Σ x·(k·E[drain] + E[completion] + base) + Σ t·(k + 1)·swap_in, linear; an
  optional weight per model switch is added.
Per-instance memory enters as the groups' allowed instances (no x where the model's
weights exceed the instance's device memory).

Simplifications for scale, all options: each queue has L positions, L = ⌈slack × fair
share⌉ + 1 instead of the paper's L = #groups; the program orders only the
`horizon_groups` most urgent groups (by deadline) and the others follow them by EDF list
scheduling; HiGHS starts from the EDF plan when that meets the chance constraints, so a
budget-limited answer is never worse than EDF. If there is no plan meeting the chance
constraints (infeasible, or no solution within the budget), the plan falls back to EDF
over groups (list scheduling onto the instance that frees up first) and, when EDF does not
meet them either, says that more capacity is needed (§A.3).

Reproducibility. The solver's budget is a deterministic work measure, not wall-clock
time: at most `max_nodes` branch-and-bound nodes and `work_limit` of HiGHS's own limit
checks (its MIP interrupt callback, which it reaches at fixed points of its single-
threaded search: root cut rounds, heuristics, nodes), with a fixed `random_seed`. The same
inputs therefore give the same plan on a busy and an idle machine, even when the budget
binds (status "work_limit"). A wall-clock `time_limit_s` exists as an opt-in safety net;
a plan it cuts short depends on the machine's speed.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from andante.cluster.qlm.estimator import RCTEstimator
from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.types import InstanceView, check_non_negative, check_positive
from andante.cluster.qlm.virtual_queue import VirtualQueue

# A completion time within this of its SLO counts as meeting it (HiGHS's feasibility
# tolerance is 1e-7 on rows carrying big-M terms).
SLO_TOLERANCE_S = 1e-6


@dataclass(frozen=True, slots=True)
class PlannerOptions:
    """The paper's knobs (§4 δ, §7 Δ and S), the penalty weights and the solver's limits.

    `delta` is for the caller's grouping (`GroupTable.snapshot(avg_batch, options.delta)`);
    with S = 8 and Δ = 0.9, k = ⌊0.8⌋ = 0: every sample must meet its SLO.
    """

    delta: float = 4.0  # group size cap, in average batches (§4, §8.3)
    num_samples: int = 8  # S, SAA samples of the stochastic terms
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

    objective: float
    feasible: bool
    expected_completion: tuple[float, ...]  # per group index, seconds from now
    num_switches: int


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


def evaluate_queues(problem: PlanProblem, queues: Sequence[Sequence[int]],
                    options: PlannerOptions) -> Evaluation:
    """Eqs. 10-13 for a given ordering (group indices per instance), sample by sample."""
    n, _, _, s = problem.shape
    if sorted(i for q in queues for i in q) != list(range(n)):
        raise ValueError(f"queues must place every group exactly once, got {queues!r}")
    mean_ct = np.zeros(n)
    feasible, switches = True, 0
    k = options.allowed_violations
    for g, queue in enumerate(queues):
        busy = np.full(s, problem.base[g])
        previous: int | None = None
        for i in queue:
            if not problem.allowed[i, g]:
                raise ValueError(f"group {problem.group_ids[i]!r} does not fit on "
                                 f"{problem.instance_ids[g]!r}")
            m = int(problem.group_model[i])
            switch = (not problem.on_device[g, m]) if previous is None else m != previous
            busy = busy + (problem.swap_in[g, m] if switch else 0.0)
            ct = busy + problem.completion[i, g]
            busy = busy + problem.drain[i, g]
            switches += int(switch)
            mean_ct[i] = ct.mean()
            feasible &= int((ct > problem.slo[i] + SLO_TOLERANCE_S).sum()) <= k
            previous = m
    objective = (options.completion_weight * float((mean_ct - problem.slo).sum())
                 + options.swap_weight * switches)
    return Evaluation(objective, bool(feasible), tuple(mean_ct.tolist()), switches)


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
    switch = (not on_device[g][m]) if last is None else m != last
    return free + (swap[g][m] if switch else 0.0) + drain[i][g], m


def subproblem(problem: PlanProblem, indices: Sequence[int]) -> PlanProblem:
    """The same instances with only the groups at `indices` (in that order)."""
    idx = np.asarray(indices, dtype=int)
    return PlanProblem(
        tuple(problem.group_ids[i] for i in idx), problem.instance_ids, problem.models,
        problem.group_model[idx], problem.slo[idx], problem.drain[idx],
        problem.completion[idx], problem.swap_in, problem.on_device, problem.base,
        problem.allowed[idx])


def queue_length(problem: PlanProblem, options: PlannerOptions) -> int:
    """Positions per virtual queue (see the design note)."""
    n = len(problem.group_ids)
    if options.max_queue_length is not None:
        return min(n, options.max_queue_length)
    share = (problem.allowed / problem.allowed.sum(axis=1, keepdims=True)).sum(axis=0)
    return min(n, math.ceil(options.queue_slack * float(share.max())) + 1)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Column offsets of the MILP's variables (x, t, B, z), blocks per (queue, position).

    Positions are counted from the tail: k = number of groups served after it on the
    queue, so the head is the highest occupied k and empty positions sit above it.
    """

    n: int
    g: int
    m: int
    s: int
    length: int
    k: int

    @property
    def num_positions(self) -> int:
        return self.g * self.length

    @property
    def uses_z(self) -> bool:
        return 0 < self.k < self.s

    def x(self, g: int, k: int) -> int:
        return (g * self.length + k) * self.n

    def t(self, g: int, k: int) -> int:
        return self.num_positions * self.n + (g * self.length + k) * self.m

    def b(self, g: int, k: int) -> int:
        return self.num_positions * (self.n + self.m) + (g * self.length + k) * self.s

    def z(self, g: int, k: int) -> int:
        return self.num_positions * (self.n + self.m + self.s) + (g * self.length + k) * self.s

    @property
    def num_vars(self) -> int:
        return self.num_positions * (self.n + self.m + self.s + (self.s if self.uses_z else 0))


@dataclass(slots=True)
class _Rows:
    """Sparse constraint rows, appended a block (R rows of K entries each) at a time."""

    rows: list[np.ndarray]
    cols: list[np.ndarray]
    vals: list[np.ndarray]
    lb: list[np.ndarray]
    ub: list[np.ndarray]
    count: int = 0

    def add(self, cols: np.ndarray, vals: np.ndarray, lb: float | np.ndarray,
            ub: float | np.ndarray) -> None:
        cols, vals = np.atleast_2d(cols), np.atleast_2d(vals)
        r = cols.shape[0]
        self.rows.append(np.repeat(np.arange(self.count, self.count + r), cols.shape[1]))
        self.cols.append(cols.ravel())
        self.vals.append(np.broadcast_to(vals, cols.shape).ravel())
        self.lb.append(np.broadcast_to(np.asarray(lb, dtype=float), (r,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, dtype=float), (r,)))
        self.count += r

    def matrix(self, num_vars: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Column-wise (start, index, value) arrays, as HiGHS takes them."""
        rows, cols = np.concatenate(self.rows), np.concatenate(self.cols)
        vals = np.concatenate(self.vals)
        order = np.lexsort((rows, cols))
        start = np.searchsorted(cols[order], np.arange(num_vars + 1))
        return start.astype(np.int32), rows[order].astype(np.int32), vals[order]


@dataclass(frozen=True, slots=True)
class _Milp:
    layout: _Layout
    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    matrix: tuple[np.ndarray, np.ndarray, np.ndarray]


def _big_m(problem: PlanProblem) -> tuple[float, float]:
    """H bounds every busy time B; big_m relaxes a violated chance row (z = 1)."""
    n = len(problem.group_ids)
    busy = (float(problem.base.max()) + float(problem.drain.max(axis=(1, 2)).sum())
            + n * float(problem.swap_in.max(initial=0.0)) + 1.0)
    slack = max(0.0, -float(problem.slo.min(initial=0.0)))
    return busy, busy + float(problem.completion.max(initial=0.0)) + slack + 1.0


def _switch_rows(rows: _Rows, p: PlanProblem, lay: _Layout, g: int, k: int,
                 ok: np.ndarray) -> None:
    """Eq. 9 per model m: t ≥ a[k,m] − a[k+1,m] − on_device[m]·(1 − occupied[k+1])."""
    for m in np.unique(p.group_model[ok]).tolist():
        init = float(p.on_device[g, m])
        members = p.group_model[ok] == m
        cols: list[np.ndarray] = [lay.x(g, k) + ok[members], np.array([lay.t(g, k) + m])]
        vals: list[np.ndarray] = [np.ones(int(members.sum())), np.array([-1.0])]
        if k + 1 < lay.length:
            cols.append(lay.x(g, k + 1) + ok)
            vals.append(np.where(members, init - 1.0, init))
        rows.add(np.concatenate(cols), np.concatenate(vals), -np.inf, init)


def _chance_rows(rows: _Rows, p: PlanProblem, lay: _Layout, g: int, k: int, ok: np.ndarray,
                 h: float, big_m: float) -> None:
    """Eq. 10 as the busy-time recursion B[k] = B[k+1] + drain + swap (B[L] = base), and
    eq. 12 by SAA: B[k] − drain + completion ≤ slo in all but k samples."""
    s = lay.s
    b = lay.b(g, k) + np.arange(s)
    xk = np.broadcast_to(lay.x(g, k) + ok, (s, len(ok)))
    nxt = k + 1 < lay.length
    rows.add(np.hstack([b[:, None], *([lay.b(g, k + 1) + np.arange(s)[:, None]] if nxt else []),
                        xk, np.broadcast_to(lay.t(g, k) + np.arange(lay.m), (s, lay.m))]),
             np.hstack([np.ones((s, 1)), *([-np.ones((s, 1))] if nxt else []),
                        -p.drain[ok, g, :].T, np.broadcast_to(-p.swap_in[g], (s, lay.m))]),
             0.0 if nxt else p.base[g], 0.0 if nxt else p.base[g])
    own = (p.completion[ok, g, :] - p.drain[ok, g, :] - p.slo[ok, None] + h).T
    cols, vals = [b[:, None], xk], [np.ones((s, 1)), own]
    if lay.uses_z:
        cols.append((lay.z(g, k) + np.arange(s))[:, None])
        vals.append(np.full((s, 1), -big_m))
        rows.add(lay.z(g, k) + np.arange(s), np.ones(s), -np.inf, float(lay.k))
    rows.add(np.hstack(cols), np.hstack(vals), -np.inf, h)


def _position_rows(rows: _Rows, p: PlanProblem, lay: _Layout, g: int, k: int,
                   h: float, big_m: float) -> None:
    """Eqs. 6-12 at tail-position k of queue g (see the design note)."""
    ok = np.flatnonzero(p.allowed[:, g])
    xk = lay.x(g, k) + ok
    rows.add(xk, np.ones(len(ok)), -np.inf, 1.0)  # one group per position
    if k + 1 < lay.length:  # occupied positions are contiguous from the tail
        rows.add(np.concatenate([lay.x(g, k + 1) + ok, xk]),
                 np.concatenate([np.ones(len(ok)), -np.ones(len(ok))]), -np.inf, 0.0)
    _switch_rows(rows, p, lay, g, k, ok)
    if lay.k < lay.s:  # the chance constraint is vacuous when every sample may miss
        _chance_rows(rows, p, lay, g, k, ok, h, big_m)


def _objective(p: PlanProblem, lay: _Layout, options: PlannerOptions) -> np.ndarray:
    """Eq. 13 without big-M: with tail positions, Σ E[ct] over a queue is linear, as a
    group at tail-position k delays the k groups behind it and a switch there k + 1."""
    c = np.zeros(lay.num_vars)
    drain, own = p.drain.mean(axis=2), p.completion.mean(axis=2)
    w = options.completion_weight
    for g in range(lay.g):
        for k in range(lay.length):
            c[lay.x(g, k):lay.x(g, k) + lay.n] = w * (k * drain[:, g] + own[:, g] + p.base[g])
            c[lay.t(g, k):lay.t(g, k) + lay.m] = w * (k + 1) * p.swap_in[g] + options.swap_weight
    return c


def _build_milp(p: PlanProblem, options: PlannerOptions, length: int) -> _Milp:
    n, g_count, m_count, s = p.shape
    lay = _Layout(n, g_count, m_count, s, length, min(options.allowed_violations, s))
    h, big_m = _big_m(p)
    rows = _Rows([], [], [], [], [])
    for i in range(n):  # every group placed exactly once (eq. 6)
        gs = np.flatnonzero(p.allowed[i]).tolist()
        rows.add(np.concatenate([lay.x(g, 0) + i + lay.n * np.arange(length) for g in gs]),
                 np.ones(len(gs) * length), 1.0, 1.0)
    for g in range(g_count):
        for k in range(length):
            _position_rows(rows, p, lay, g, k, h, big_m)
    lb, ub = np.zeros(lay.num_vars), np.full(lay.num_vars, np.inf)
    integrality = np.zeros(lay.num_vars, dtype=bool)
    for g in range(g_count):
        for k in range(length):
            ub[lay.x(g, k):lay.x(g, k) + n] = p.allowed[:, g]
            integrality[lay.x(g, k):lay.x(g, k) + n] = True
            ub[lay.t(g, k):lay.t(g, k) + m_count] = 1.0
            if lay.uses_z:
                ub[lay.z(g, k):lay.z(g, k) + s] = 1.0
                integrality[lay.z(g, k):lay.z(g, k) + s] = True
    return _Milp(lay, _objective(p, lay, options), lb, ub, integrality,
                 np.concatenate(rows.lb), np.concatenate(rows.ub), rows.matrix(lay.num_vars))


def _start_values(p: PlanProblem, lay: _Layout, queues: Sequence[Sequence[int]]
                  ) -> np.ndarray:
    """The full MILP vector of a given plan (the EDF incumbent handed to HiGHS)."""
    v = np.zeros(lay.num_vars)
    for g, queue in enumerate(queues):
        busy = np.full(lay.s, p.base[g])
        for k in range(len(queue), lay.length):  # empty positions above the head
            v[lay.b(g, k):lay.b(g, k) + lay.s] = busy
        previous: int | None = None
        for idx, i in enumerate(queue):
            k, m = len(queue) - 1 - idx, int(p.group_model[i])
            switch = (not p.on_device[g, m]) if previous is None else m != previous
            busy = busy + (p.swap_in[g, m] if switch else 0.0) + p.drain[i, g]
            v[lay.x(g, k) + i] = 1.0
            v[lay.t(g, k) + m] = float(switch)
            v[lay.b(g, k):lay.b(g, k) + lay.s] = busy
            if lay.uses_z:
                late = busy - p.drain[i, g] + p.completion[i, g] > p.slo[i] + SLO_TOLERANCE_S
                v[lay.z(g, k):lay.z(g, k) + lay.s] = late
            previous = m
    return v


@functools.cache
def _quiet_first_highs() -> None:
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
    _quiet_first_highs()
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


def _run_highs(model: _Milp, options: PlannerOptions, start: np.ndarray | None
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


def _extract(x: np.ndarray, lay: _Layout) -> list[list[int]]:
    """Queues in service order: head (highest occupied tail-position) first."""
    queues: list[list[int]] = []
    for g in range(lay.g):
        queue = []
        for k in reversed(range(lay.length)):
            block = x[lay.x(g, k):lay.x(g, k) + lay.n]
            if block.max(initial=0.0) > 0.5:
                queue.append(int(block.argmax()))
        queues.append(queue)
    return queues


def _plan(p: PlanProblem, queues: Sequence[Sequence[int]], ev: Evaluation, *, fallback: bool,
          needs_capacity: bool, status: str, reason: str, source: str = "milp") -> Plan:
    vqs = tuple(VirtualQueue(p.instance_ids[g], tuple(p.group_ids[i] for i in q))
                for g, q in enumerate(queues))
    return Plan(vqs, ev.objective, ev.feasible, fallback, needs_capacity, status, reason,
                source)


def _solve_milp(p: PlanProblem, options: PlannerOptions) -> tuple[str, list[list[int]] | None]:
    """HiGHS on the §7 program, seeded with the EDF plan when that meets the constraints."""
    model = _build_milp(p, options, queue_length(p, options))
    edf = edf_queues(p)
    seed_ok = (evaluate_queues(p, edf, options).feasible
               and all(len(q) <= model.layout.length for q in edf))
    status, x = _run_highs(model, options, _start_values(p, model.layout, edf) if seed_ok
                           else None)
    return status, None if x is None else _extract(x, model.layout)


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
