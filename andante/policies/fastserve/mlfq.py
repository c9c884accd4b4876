"""Job orders for FastServe: the skip-join MLFQ and the FCFS order of its ablation.

Design note: FastServe §4.1, Algorithm 1 (skip-join MLFQ) and §4.2 (ENST).
Queues Q1..Qn have quanta q1 < q2 < ... (q_k = q1·ratio^(k-1)); jobs run in queue
order, FIFO within a queue.
- Skip-join (lines 6-9): an arriving job joins the highest-priority queue whose quantum
  covers its predicted first iteration (its prefill) instead of Q1.
- Demotion (lines 16-17): a job whose attained service in its queue reaches the quantum
  moves to the first lower queue whose quantum covers its next iteration, joining its
  tail; the last queue keeps it (round robin there).
- Starvation prevention (lines 19-21): a job not scheduled for α seconds returns to Q1;
  one already in Q1 keeps its place there (its clock restarts): moving it to Q1's tail
  again every α would put every later arrival ahead of it, a starvation of its own.
- ENST (§4.2): the estimated next scheduled time of job i is
  min(T_promote(i), T_execute(i)), T_promote = the time left until its promotion and
  T_execute = (1/B)·Σ_{j ahead of i} (the quanta j spends before it falls behind i),
  assuming jobs ahead do not finish first. For j in a higher queue that is the quanta
  of the queues from j's down to i's, as in the paper; for j ahead in i's own queue we
  add its remaining quantum there (the paper's sum is empty for them).
Bookkeeping is O(1) per event (dicts keep insertion order); one ENST pass is O(jobs).
`replay_decode_run` applies, for a run of identical decode steps that the simulator
applied at once (andante.sim.decode_run), what scheduling and charging them one by one
would have: promotions, last-run times, charges and demotions, step by step.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from itertools import pairwise

from andante.core.request import Request


@dataclass(slots=True)
class JobState:
    level: int  # 0 = Q1, the highest priority
    last_run: float  # when it was last scheduled (or arrived, or was promoted)
    attained: float = 0.0  # service received in its current queue, seconds


class SkipJoinMLFQ:
    """The queues of Algorithm 1 with per-job state; iteration gives priority order."""

    def __init__(self, quanta: Sequence[float], starve_limit: float | None) -> None:
        if not quanta or any(b <= a for a, b in zip(quanta, quanta[1:], strict=False)):
            raise ValueError(f"quanta must be non-empty and increasing, got {list(quanta)}")
        self.quanta = tuple(quanta)
        # attained service that uses up each queue's quantum (the test `charge` makes)
        self._spent = tuple(q * (1.0 - 1e-9) for q in self.quanta)
        self.starve_limit = starve_limit
        self._prefix = [0.0]  # _prefix[k] = q_0 + ... + q_{k-1}
        for q in self.quanta:
            self._prefix.append(self._prefix[-1] + q)
        self._queues: list[dict[Request, None]] = [{} for _ in self.quanta]
        self._attained = [0.0] * len(self.quanta)  # Σ attained per queue
        self._jobs: dict[Request, JobState] = {}
        self._by_last_run: dict[Request, None] = {}  # oldest last_run first
        self._order: list[Request] | None = []  # `ordered()` (None: changed since)

    def __len__(self) -> int:
        return len(self._jobs)

    def state_of(self, req: Request) -> JobState:
        return self._jobs[req]

    def level_for(self, iteration_time: float, lowest: int = 0) -> int:
        """The highest-priority queue at or below `lowest` whose quantum covers the time."""
        level = bisect.bisect_left(self.quanta, iteration_time, lo=lowest)
        return min(level, len(self.quanta) - 1)

    # ---- events ---------------------------------------------------------------------
    def add(self, req: Request, first_iteration_time: float, now: float) -> None:
        """Skip-join: queue the job where its first iteration fits one quantum."""
        level = self.level_for(first_iteration_time)
        self._jobs[req] = JobState(level, now)
        self._queues[level][req] = None
        self._order = None
        self._by_last_run[req] = None

    def remove(self, req: Request) -> None:
        state = self._jobs.pop(req, None)
        if state is not None:
            self._order = None
            del self._queues[state.level][req]
            del self._by_last_run[req]
            self._attained[state.level] -= state.attained
            if not self._queues[state.level]:
                self._attained[state.level] = 0.0  # no float drift in empty queues

    def mark_run(self, req: Request, now: float) -> None:
        """The job was scheduled at `now`: its starvation clock restarts."""
        state = self._jobs[req]
        state.last_run = now
        del self._by_last_run[req]
        self._by_last_run[req] = None

    def charge(self, req: Request, service: float,
               next_iteration_time: Callable[[Request], float]) -> None:
        """Add one iteration's service; demote the job if its quantum is used up."""
        state = self._jobs.get(req)
        if state is None:
            return
        state.attained += service
        level = state.level
        self._attained[level] += service
        if state.attained < self._spent[level]:
            return
        new_level = self.level_for(next_iteration_time(req), min(level + 1, len(self.quanta) - 1))
        self._move(req, state, new_level)

    def charge_batch(self, reqs: Sequence[Request], service: float,
                     next_iteration_time: Callable[[Request], float]) -> None:
        """`charge` of each of `reqs` (a step's batch) still queued, in order."""
        self._charge_all(reqs, 0, service, lambda req, _step: next_iteration_time(req))

    def replay_decode_run(self, reqs: Sequence[Request], starts: Sequence[float],
                          services: Sequence[float],
                          next_iteration_time: Callable[[Request, int], float]) -> None:
        """Step j of the run was scheduled at starts[j] and charged services[j] with every
        job (`reqs`) in it; `next_iteration_time(req, j)`: the job's next iteration after
        step j (the job has since advanced by the later steps). When no job can starve
        during the run, only the last step's start time matters (and the order of the
        jobs then); otherwise every step is scheduled and charged as it was."""
        last = len(services) - 1
        limit = self.starve_limit
        oldest = next(iter(self._by_last_run), None)
        if limit is not None and oldest is not None and (
                starts[0] - self._jobs[oldest].last_run >= limit
                or any(b - a >= limit for a, b in pairwise(starts))):
            for j, service in enumerate(services):
                self.promote_starved(starts[j])
                self._mark_all(starts[j])
                self._charge_all(reqs, j, service, next_iteration_time)
            return
        for j in range(last):
            self._charge_all(reqs, j, services[j], next_iteration_time)
        self._mark_all(starts[last])
        self._charge_all(reqs, last, services[last], next_iteration_time)

    def _mark_all(self, now: float) -> None:
        """Every job was scheduled at `now`, in the job order (as a step marks them)."""
        for req in self.ordered():
            self.mark_run(req, now)

    def _charge_all(self, reqs: Sequence[Request], step: int, service: float,
                    next_iteration_time: Callable[[Request, int], float]) -> None:
        """`charge` of each job still queued, inlined (a run's hot loop)."""
        jobs, spent, attained = self._jobs, self._spent, self._attained
        lowest = len(spent) - 1
        for req in reqs:
            state = jobs.get(req)
            if state is None:
                continue
            level = state.level
            state.attained += service
            attained[level] += service
            if state.attained >= spent[level]:
                new_level = self.level_for(next_iteration_time(req, step),
                                           min(level + 1, lowest))
                self._move(req, state, new_level)

    def would_promote(self, now: float) -> bool:
        """Would `promote_starved(now)` move a job?"""
        oldest = next(iter(self._by_last_run), None)
        return self.starve_limit is not None and oldest is not None and \
            now - self._jobs[oldest].last_run >= self.starve_limit

    def promote_starved(self, now: float) -> list[Request]:
        """Move every job idle for at least α to the tail of Q1 (Algorithm 1, line 19)."""
        limit = self.starve_limit
        if limit is None:
            return []
        starved: list[Request] = []
        for req in self._by_last_run:
            if now - self._jobs[req].last_run < limit:
                break
            starved.append(req)
        for req in starved:
            state = self._jobs[req]
            if state.level:
                self._move(req, state, 0)
            self.mark_run(req, now)  # starveTime <- 0
        return starved

    def _move(self, req: Request, state: JobState, level: int) -> None:
        self._order = None
        del self._queues[state.level][req]
        self._attained[state.level] -= state.attained
        if not self._queues[state.level]:
            self._attained[state.level] = 0.0
        state.level = level
        state.attained = 0.0
        self._queues[level][req] = None

    # ---- views ----------------------------------------------------------------------
    def ordered(self) -> list[Request]:
        """Every job, highest priority first (a new list; the order is kept between
        the events that change it: arrivals, finishes, demotions and promotions)."""
        if self._order is None:
            self._order = [req for queue in self._queues for req in queue]
        return list(self._order)

    def enst(self, batch_size: int, now: float,
             wanted: Collection[Request]) -> dict[Request, float]:
        """ENST of the `wanted` jobs, in seconds from `now` (0 at the very front).

        Queues without a wanted job are summed in O(1) from their totals.
        """
        inv_b = 1.0 / max(1, batch_size)
        limit = self.starve_limit
        prefix, jobs, quanta = self._prefix, self._jobs, self.quanta
        levels = {jobs[r].level for r in wanted if r in jobs}
        out: dict[Request, float] = {}
        count = 0  # jobs in the queues above the current one
        sum_prefix = 0.0  # their Σ prefix[level]
        sum_attained = 0.0  # their Σ attained
        for level, queue in enumerate(self._queues):
            if not levels:
                break
            if level in levels:
                levels.discard(level)
                above = count * prefix[level] - sum_prefix - sum_attained
                quantum = quanta[level]
                ahead = 0.0
                for req in queue:
                    state = jobs[req]
                    if req in wanted:
                        t = (above + ahead) * inv_b
                        if limit is not None:
                            t = min(t, max(0.0, limit - (now - state.last_run)))
                        out[req] = t
                    ahead += quantum - state.attained
            n = len(queue)
            count += n
            sum_prefix += prefix[level] * n
            sum_attained += self._attained[level]
        return out


class FCFSOrder:
    """Arrival order with the same interface (FastServe-FCFS, §6.1 baseline)."""

    def __init__(self) -> None:
        self._jobs: dict[Request, None] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, req: Request, first_iteration_time: float, now: float) -> None:
        self._jobs[req] = None

    def remove(self, req: Request) -> None:
        self._jobs.pop(req, None)

    def mark_run(self, req: Request, now: float) -> None:
        return None

    def charge(self, req: Request, service: float,
               next_iteration_time: Callable[[Request], float]) -> None:
        return None

    def charge_batch(self, reqs: Sequence[Request], service: float,
                     next_iteration_time: Callable[[Request], float]) -> None:
        return None

    def would_promote(self, now: float) -> bool:
        return False

    def promote_starved(self, now: float) -> list[Request]:
        return []

    def replay_decode_run(self, reqs: Sequence[Request], starts: Sequence[float],
                          services: Sequence[float],
                          next_iteration_time: Callable[[Request, int], float]) -> None:
        return None

    def ordered(self) -> list[Request]:
        return sorted(self._jobs, key=_arrival)  # insertion order is nearly sorted

    def enst(self, batch_size: int, now: float,
             wanted: Collection[Request]) -> dict[Request, float]:
        """Rank in arrival order: later arrivals run later (only the order matters)."""
        return {req: float(i) for i, req in enumerate(self.ordered()) if req in wanted}


def _arrival(req: Request) -> float:
    return req.arrival_time


def geometric_quanta(base: float, ratio: float, num_queues: int) -> list[float]:
    """q_k = base·ratio^(k-1), k = 1..num_queues (FastServe: base = the minimum
    iteration time, ratio 2)."""
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base quantum must be > 0, got {base!r}")
    if not ratio > 1:
        raise ValueError(f"quantum ratio must be > 1, got {ratio!r}")
    if num_queues < 1:
        raise ValueError(f"num_queues must be >= 1, got {num_queues!r}")
    return [base * ratio**k for k in range(num_queues)]
