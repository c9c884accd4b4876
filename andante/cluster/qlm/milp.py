"""The plan generator's mixed-integer program (QLM §7, eqs. 6-13).

Design note. The plan assigns every request group to a position of one virtual queue and
is a mixed-integer program, following §7. Positions are counted from the tail of each
queue (k = the number of groups served after it), which keeps the objective linear
without big-M terms:
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
  violate, with binaries z[g,k,s] and big-M (k = 0, Δ = 1, needs no z); a position's
  whole chance constraint may be relaxed by a binary v[g,k] at the penalty `miss_penalty`
  (andante.cluster.qlm.plan_problem), so a hopeless group never makes the program
  infeasible: the program gives up as few groups as it can, then minimises eq. 13;
- objective (eq. 13): min Σ E[ct − slo] = Σ E[ct] − Σ slo. With tail positions, a group at
  position k delays the k groups behind it and a switch there delays k + 1 groups, so
  Σ E[ct] = Σ x·(k·E[drain] + E[completion] + base) + Σ t·(k + 1)·swap_in, linear; an
  optional weight per model switch and the penalty of each relaxed position are added.
Per-instance memory enters as the groups' allowed instances (no x where the model's
weights exceed the instance's device memory). Each queue has L positions,
L = ⌈slack × fair share⌉ + 1 instead of the paper's L = #groups (`queue_length`).
`start_values` writes a given plan (the EDF incumbent) as the program's vector and
`extract_queues` reads the queues back from a solution; HiGHS solves it
(andante.cluster.qlm.highs_solver).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from andante.cluster.qlm.plan_problem import (
    SLO_TOLERANCE_S,
    PlannerOptions,
    PlanProblem,
    is_model_switch,
    miss_penalty,
    time_bounds,
)


def queue_length(problem: PlanProblem, options: PlannerOptions) -> int:
    """Positions per virtual queue (see the design note)."""
    n = len(problem.group_ids)
    if options.max_queue_length is not None:
        return min(n, options.max_queue_length)
    share = (problem.allowed / problem.allowed.sum(axis=1, keepdims=True)).sum(axis=0)
    return min(n, math.ceil(options.queue_slack * float(share.max())) + 1)


@dataclass(frozen=True, slots=True)
class MilpLayout:
    """Column offsets of the MILP's variables (x, t, B, z, v), blocks per (queue, position).

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

    def v(self, g: int, k: int) -> int:
        return (self.num_positions * (self.n + self.m + self.s + (self.s if self.uses_z else 0))
                + g * self.length + k)

    @property
    def num_vars(self) -> int:
        return self.num_positions * (self.n + self.m + self.s + (self.s if self.uses_z else 0)
                                     + 1)


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
class Milp:
    """The program as HiGHS takes it: costs, bounds, integrality and sparse rows."""

    layout: MilpLayout
    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    matrix: tuple[np.ndarray, np.ndarray, np.ndarray]


def _switch_rows(rows: _Rows, p: PlanProblem, lay: MilpLayout, g: int, k: int,
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


def _chance_rows(rows: _Rows, p: PlanProblem, lay: MilpLayout, g: int, k: int,
                 ok: np.ndarray, h: float, big_m: float) -> None:
    """Eq. 10 as the busy-time recursion B[k] = B[k+1] + drain + swap (B[L] = base), and
    eq. 12 by SAA: B[k] − drain + completion ≤ slo in all but k samples, unless the
    position is relaxed (v = 1)."""
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
    cols = [b[:, None], xk, np.full((s, 1), lay.v(g, k))]
    vals = [np.ones((s, 1)), own, np.full((s, 1), -big_m)]
    if lay.uses_z:
        cols.append((lay.z(g, k) + np.arange(s))[:, None])
        vals.append(np.full((s, 1), -big_m))
        rows.add(lay.z(g, k) + np.arange(s), np.ones(s), -np.inf, float(lay.k))
    rows.add(np.hstack(cols), np.hstack(vals), -np.inf, h)


def _position_rows(rows: _Rows, p: PlanProblem, lay: MilpLayout, g: int, k: int,
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


def _objective(p: PlanProblem, lay: MilpLayout, options: PlannerOptions) -> np.ndarray:
    penalty = miss_penalty(p, options)
    """Eq. 13 without big-M: with tail positions, Σ E[ct] over a queue is linear, as a
    group at tail-position k delays the k groups behind it and a switch there k + 1."""
    c = np.zeros(lay.num_vars)
    drain, own = p.drain.mean(axis=2), p.completion.mean(axis=2)
    w = options.completion_weight
    for g in range(lay.g):
        for k in range(lay.length):
            c[lay.x(g, k):lay.x(g, k) + lay.n] = w * (k * drain[:, g] + own[:, g] + p.base[g])
            c[lay.t(g, k):lay.t(g, k) + lay.m] = w * (k + 1) * p.swap_in[g] + options.swap_weight
            c[lay.v(g, k)] = penalty
    return c


def build_milp(p: PlanProblem, options: PlannerOptions, length: int) -> Milp:
    n, g_count, m_count, s = p.shape
    lay = MilpLayout(n, g_count, m_count, s, length, min(options.allowed_violations, s))
    h, big_m = time_bounds(p)
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
            ub[lay.v(g, k)] = 1.0 if lay.k < s else 0.0
            integrality[lay.v(g, k)] = True
    return Milp(lay, _objective(p, lay, options), lb, ub, integrality,
                 np.concatenate(rows.lb), np.concatenate(rows.ub), rows.matrix(lay.num_vars))


def start_values(p: PlanProblem, lay: MilpLayout, queues: Sequence[Sequence[int]]
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
            switch = is_model_switch(bool(p.on_device[g, m]), previous, m)
            busy = busy + (p.swap_in[g, m] if switch else 0.0) + p.drain[i, g]
            v[lay.x(g, k) + i] = 1.0
            v[lay.t(g, k) + m] = float(switch)
            v[lay.b(g, k):lay.b(g, k) + lay.s] = busy
            late = busy - p.drain[i, g] + p.completion[i, g] > p.slo[i] + SLO_TOLERANCE_S
            relaxed = lay.k < lay.s and int(late.sum()) > lay.k
            v[lay.v(g, k)] = float(relaxed)
            if lay.uses_z and not relaxed:
                v[lay.z(g, k):lay.z(g, k) + lay.s] = late
            previous = m
    return v


def extract_queues(x: np.ndarray, lay: MilpLayout) -> list[list[int]]:
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
