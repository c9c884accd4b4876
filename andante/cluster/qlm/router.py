"""The `qlm` router: QLM's global queue, virtual queues and serving operations, wired to
the cluster controller (Patke et al., §3-7).

Design note. The controller keeps every request in its global queue; on each event it
calls `dispatch`, which plays the global scheduler and the per-instance agents (§3, §5):
1. request groups (§4): the queued requests in a `GroupTable` keyed by model, SLO class
   (the deadline) and prompt-length bucket, split at δ × the average batch;
2. virtual queues: one ordering of groups per instance. A new group joins the instance
   its key already lives on, else (load balancing, LSO 4) the one where the estimator
   expects it to finish first (queued drain + model swap, §6); within a queue groups are
   ordered by deadline (EDF) unless a plan ordered them;
3. on every arrival or completion (a change of the group table), the estimator (§6)
   checks whether any group is expected to miss its SLO; if so the plan generator (§7,
   MILP with HiGHS) reorders and reassigns every group. The planner is rate-limited:
   the next plan no sooner than `replan_interval` seconds of cluster time later. That
   interval stands for the plan's own solve time, and it is a fixed quantity, not a
   measured one, so that a simulated run decides the same on any machine and load
   (HiGHS's budget is deterministic work for the same reason: highs_solver). The
   solver's budget keeps the real solve below it (benchmarks/qlm_planner.py: under
   100 ms for 100 groups against the 0.25 s default); on a real server the dispatch
   loop is busy while it solves, so the next dispatch's "now" lies past the solve.
   Invocations, plans and EDF fallbacks (the solver found nothing) are counted, and so
   are plans that say more capacity is needed (§A.3). The estimator's execution times
   are the instances' cost models scaled by their learned speed (andante.cluster.qlm
   .speed: Θ measured from the load reports' engine steps), and an instance's current
   work holds the queue back only in proportion to its occupied batch slots
   (continuous batching starts a queued request as soon as a slot frees);
4. per instance, its QLM agent (andante.cluster.qlm.agents, §5) turns the head of its
   virtual queue into model swaps and warm starts (LSO 5), request pulling (LSO 1) and,
   when the head group changes and does not fit, eviction or GPU-CPU state swap of
   running requests due after it (LSOs 2-3, per request by cost:
   andante.cluster.qlm.eviction), which the instances apply (`Instance.evict`).
Routers read no clock: "now" is the latest instance report's time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from andante.cluster.instance import ModelState
from andante.cluster.qlm.agents import AgentInstance, AgentOptions, ModelView, QLMAgents
from andante.cluster.qlm.estimator import (
    DEFAULT_CONTEXT_TOKENS,
    CostModelTable,
    ExecutionCost,
    OutputLengthModel,
    RCTEstimator,
)
from andante.cluster.qlm.eviction import RunningRequest
from andante.cluster.qlm.groups import GroupKey, GroupTable, RequestGroup
from andante.cluster.qlm.plan_problem import PlannerOptions
from andante.cluster.qlm.planner import generate_plan
from andante.cluster.qlm.speed import LearnedCost, SpeedLearner
from andante.cluster.qlm.types import InstanceView as QLMView
from andante.cluster.qlm.types import QueuedRequest
from andante.cluster.router import QueueDecision
from andante.core.request import PreemptionMode, Request, RequestStatus
from andante.engine.stats import SchedulerStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class QLMCounters:
    """What the router did: planner invocations, the plans it made and its EDF fallbacks
    (the solver found nothing), "more capacity is needed", swaps."""

    num_invocations: int = 0
    num_plans: int = 0
    num_fallbacks: int = 0
    num_needs_capacity: int = 0
    num_swaps: int = 0
    num_warm_starts: int = 0
    num_evictions: int = 0  # running requests removed for a new head group (LSO 2)
    num_state_swaps: int = 0  # of them, swapped to host memory rather than evicted (LSO 3)
    max_groups: int = 0  # the most request groups at one dispatch
    predicted: dict[str, float] = field(default_factory=dict)  # request id -> completion
    predicted_start: dict[str, float] = field(default_factory=dict)  # id -> W_q + now
    head_outcomes: dict[str, int] = field(default_factory=dict)  # eviction checks (LSO 2)

    def summary(self) -> dict[str, int]:
        outcomes = {f"head_{k}": v for k, v in sorted(self.head_outcomes.items())}
        return outcomes | {
                "planner_invocations": self.num_invocations, "planner_plans": self.num_plans,
                "planner_fallbacks": self.num_fallbacks,
                "num_needs_capacity": self.num_needs_capacity, "num_swaps": self.num_swaps,
                "num_warm_starts": self.num_warm_starts, "num_evictions": self.num_evictions,
                "num_state_swaps": self.num_state_swaps, "max_groups": self.max_groups}


class QLMRouter:
    """Options are the paper's knobs (δ, S, Δ, the solver's budget and horizon) and
    one switch per operation, for the ablation: `pull`, `load_balance`, `warm_start`,
    `plan` (False: EDF over groups only). `pull_reserve`: KV tokens a pulled request
    reserves for its output, in mean outputs of its group. `learn_speed`: learn each
    instance's speed from its load reports and finished requests
    (andante.cluster.qlm.speed; False: the cost model alone). `swap_hysteresis`: a
    model swap before the instance drains needs the device model to have served this
    many times its own load time; `pull_tokens`: the prompt tokens an instance may hold
    not yet prefilled, its pulls included (`pull`, `warm_start`, `pull_reserve`,
    `pull_tokens` and `swap_hysteresis` are the agents' options: andante.cluster.qlm.agents)."""

    name = "qlm"

    def __init__(self, delta: float = 4.0, avg_batch: int = 32, num_samples: int = 10,
                 chance_level: float = 0.9, work_limit: int = 20, max_nodes: int = 500,
                 time_limit_ms: float | None = None,
                 horizon_groups: int = 12, replan_interval: float = 0.25,
                 default_deadline: float = 3600.0, pull: bool = True,
                 load_balance: bool = True, warm_start: bool = True, plan: bool = True,
                 pull_reserve: float = 1.0, pull_tokens: int = 8192, learn_speed: bool = True,
                 swap_hysteresis: float = 2.0, evict: bool = True, state_swap: bool = True,
                 seed: int = 0, **unknown: Any) -> None:
        if unknown:
            raise ValueError(f"router 'qlm': unknown option(s) {sorted(unknown)}")
        if avg_batch < 1:
            raise ValueError(f"qlm: avg_batch must be >= 1, got {avg_batch!r}")
        if not isinstance(learn_speed, bool):
            raise ValueError(f"qlm: learn_speed must be true or false, got {learn_speed!r}")
        if pull_reserve < 0 or swap_hysteresis < 0:
            raise ValueError(f"qlm: pull_reserve and swap_hysteresis must be >= 0, "
                             f"got {pull_reserve!r}, {swap_hysteresis!r}")
        if replan_interval < 0 or default_deadline <= 0:
            raise ValueError(f"qlm: replan_interval must be >= 0 and default_deadline > 0, "
                             f"got {replan_interval!r}, {default_deadline!r}")
        self.options = PlannerOptions(delta=delta, num_samples=num_samples,
                                      chance_level=chance_level,
                                      work_limit=work_limit, max_nodes=max_nodes,
                                      time_limit_s=None if time_limit_ms is None
                                      else time_limit_ms / 1000.0,
                                      horizon_groups=horizon_groups, seed=seed)
        self.agent_options = AgentOptions(pull=pull, warm_start=warm_start,
                                          pull_reserve=pull_reserve, pull_tokens=pull_tokens,
                                          swap_hysteresis=swap_hysteresis,
                                          evict=evict, state_swap=state_swap)
        self.avg_batch, self.replan_interval = avg_batch, replan_interval
        self.default_deadline = default_deadline
        self.load_balance, self.plan = load_balance, plan
        self.learn_speed = learn_speed
        self._init_state()

    def _init_state(self) -> None:
        self.counters = QLMCounters()
        self.outputs = OutputLengthModel()
        self.speed = SpeedLearner()
        self._base_cost: CostModelTable | None = None  # the latest states' cost models
        self._table = GroupTable()
        self._snapshot: tuple[tuple[int, int, int], tuple[RequestGroup, ...]] | None = None
        self._keys: dict[str, GroupKey] = {}  # placed request id -> its group key
        self._order: dict[str, tuple[int, int]] = {}  # group id -> (instance, position)
        self._moved: set[str] = set()  # groups re-balanced off their instance (`_queues`)
        self._next_plan = -math.inf  # the planner's rate limit (module note, item 3)
        self._revision = 0  # bumped by every arrival and completion
        self._checked = -1  # the revision the estimator last checked
        self._placed: dict[str, int] = {}  # request id -> instance
        self._deadlines: dict[int, dict[str, float]] = {}  # instance -> its requests'
        self._requests: dict[str, Request] = {}  # placed request id -> the request
        self._first_predicted: dict[str, float] = {}  # request id -> when (`_predict_new`)
        self._finished_tokens: dict[int, int] = {}  # instance -> outputs since its report
        self.agents = QLMAgents(self.agent_options, self.outputs)

    # ---- Router -----------------------------------------------------------------------
    def route(self, req: Request, instances: Sequence[Any]) -> int | None:
        return None

    def place_handoff(self, req: Request, source: int, instances: Sequence[Any]) -> int | None:
        return None

    def on_finished(self, req: Request) -> None:
        self._revision += 1
        key = self._keys.pop(req.request_id, None)
        placed = self._unplace(req.request_id)
        if placed is not None:  # Θ counts the tokens it generated there (speed.py)
            self._finished_tokens[placed] = (self._finished_tokens.get(placed, 0)
                                             + req.num_output_tokens)
        if key is None or not req.num_output_tokens or req.timeline.finish_time is None:
            return
        self.outputs.observe(key, req.num_output_tokens, req.sampling.max_tokens)
        if placed is None:
            return
        timeline = req.timeline
        if (self.learn_speed and self._base_cost is not None
                and timeline.first_scheduled_time is not None
                and not timeline.preemption_times):  # ran on one instance, unpreempted
            self.speed.observe_first_token(self._base_cost, (str(placed), key.model),
                                           req.num_prompt_tokens,
                                           timeline.first_scheduled_time, timeline.token_times)
            self.speed.observe_decode_span(LearnedCost(self._base_cost, self.speed),
                                           (str(placed), key.model), req.num_prompt_tokens,
                                           timeline.token_times)

    # ---- QueueRouter ------------------------------------------------------------------
    def dispatch(self, queue: Sequence[Request], instances: Sequence[Any]) -> QueueDecision:
        views = [v for v in instances if v.alive and v.multi_model is not None]
        if not queue or not views:
            return QueueDecision()
        states = {v.index: v.multi_model.model_state() for v in views}
        now = max(v.load.stats.time for v in views)
        if self.learn_speed:
            self._observe_speed(views, states)
        self._sync(queue, states[views[0].index].device, now)
        groups = self._groups()
        self.counters.max_groups = max(self.counters.max_groups, len(groups))
        servable = {m for state in states.values() for m in state.costs}
        refused = tuple((rid, views[0].index) for g in groups if g.model not in servable
                        for rid in g.request_ids)  # no instance holds the model: refused
        groups = tuple(g for g in groups if g.model in servable)
        share = -(-len(queue) // len(views))  # queued requests per instance
        estimator = self._estimator(states)
        running = {v.index: self._running(v.index, self._step_s(v, states[v.index], estimator))
                   for v in views}
        qviews = {v.index: self._qlm_view(v, states[v.index], share, running[v.index])
                  for v in views}
        holds = {i: frozenset(s.costs) for i, s in states.items()}
        room = {v.index: self._pull_tokens(v, states[v.index]) for v in views}
        queues = self._queues(groups, qviews, estimator, holds, room)
        if self.plan and self._checked != self._revision and now >= self._next_plan:
            self._checked = self._revision
            if self._plan_if_late(groups, queues, qviews, estimator, now, holds):
                queues = self._queues(groups, qviews, estimator, holds, room)
        self._predict_new(queues, qviews, estimator, now)
        decision = self._act(queue, queues, views, states, qviews, estimator, running, now)
        return dataclasses.replace(decision, placements=decision.placements + refused)

    def _act(self, queue: Sequence[Request], queues: dict[int, list[RequestGroup]],
             views: Sequence[ModelView],
             states: dict[int, ModelState], qviews: dict[int, QLMView],
             estimator: RCTEstimator, running: dict[int, tuple[RunningRequest, ...]],
             now: float) -> QueueDecision:
        """The agents' operations (§5); the requests they pull leave the group table."""
        instances = [AgentInstance(v, states[v.index], qviews[v.index],
                                   self._drain_s(v, states[v.index]),
                                   self._deadlines.get(v.index, {}), running[v.index])
                     for v in views]
        decision = self.agents.act(queues, instances, estimator, now, frozenset(self._moved))
        self.counters.num_swaps += len(decision.swaps)
        self.counters.num_warm_starts += len(decision.warm)
        self.counters.num_evictions += len(decision.evictions)
        self.counters.head_outcomes = dict(self.agents.head_outcomes)
        self.counters.num_state_swaps += sum(
            1 for _, _, mode in decision.evictions if mode is PreemptionMode.SWAP)
        by_id = {req.request_id: req for req in queue}
        for rid, index in decision.placements:
            self._requests[rid] = by_id[rid]
            self._keys[rid] = self._table.key_for(self._table.get(rid))
            self._placed[rid] = index
            self._deadlines.setdefault(index, {})[rid] = self._table.get(rid).deadline
        self._table.remove(rid for rid, _ in decision.placements)
        return decision

    def _groups(self) -> tuple[RequestGroup, ...]:
        """The group table's snapshot (Algorithm 1), rebuilt only when what it depends on
        changed: the queued requests, the group cap δ × the average batch, or the
        learned output lengths (most dispatches, one per engine step, change none)."""
        batch = self._average_batch()
        key = (self._table.revision, max(1, math.ceil(self.options.delta * batch)),
               self.outputs.num_observed)
        if self._snapshot is None or self._snapshot[0] != key:
            self._snapshot = (key, self._table.snapshot(batch, self.options.delta,
                                                        self.outputs.mean))
        return self._snapshot[1]

    def _average_batch(self) -> float:
        """The average batch δ multiplies (§4): measured on the instances (learned
        speed), else the `avg_batch` option (also the prior before any measurement)."""
        measured = self.speed.average_batch() if self.learn_speed else None
        return self.avg_batch if measured is None else max(1.0, measured)

    def _observe_speed(self, views: Sequence[ModelView], states: dict[int, ModelState]
                       ) -> None:
        """Θ measured: each instance's engine steps since its previous report."""
        if self._base_cost is None:
            return
        for view in views:
            state = states[view.index]
            self.speed.observe_report(self._base_cost, (str(view.index), state.device),
                                      view.load.stats, state.loading_s > 0,
                                      self._finished_tokens.pop(view.index, 0))
        now = max(v.load.stats.time for v in views)
        earliest = dict.fromkeys((v.index for v in views), now)
        for rid, index in self._placed.items():  # ε reads spans from the first token on
            times = self._requests[rid].timeline.token_times
            if times and index in earliest:
                earliest[index] = min(earliest[index], times[0])
        for index, time in earliest.items():
            self.speed.forget_batches_before(str(index), time)

    # ---- groups and virtual queues ------------------------------------------------------
    def _sync(self, queue: Sequence[Request], default_model: str, now: float) -> None:
        """The group table holds exactly the queued requests."""
        queued = {req.request_id for req in queue}
        gone = [rid for rid in self._table.request_ids() if rid not in queued]
        self._table.remove(gone)
        for req in queue:
            if req.request_id not in self._table:
                self._unplace(req.request_id)  # back from an instance (a swap's flush)
                self._table.add(self._queued(req, default_model))
                self._revision += 1

    def _running(self, index: int, step_s: float) -> tuple[RunningRequest, ...]:
        """The requests placed on instance `index` that run there now (hold KV), each
        with its expected remaining time: its own expected output (its key's learned
        mean, capped by its max_tokens as the draws are: OutputLengthModel) less what it
        has produced, at `step_s` a step."""
        deadlines = self._deadlines.get(index, {})
        return tuple(RunningRequest(rid, deadline, req.num_computed_tokens,
                                    self._remaining_tokens(rid, req) * step_s)
                     for rid, deadline in deadlines.items()
                     if (req := self._requests.get(rid)) is not None
                     and req.status is RequestStatus.RUNNING)

    def _remaining_tokens(self, request_id: str, req: Request) -> float:
        """Output tokens `req` is expected still to produce (at least one)."""
        expected = self.outputs.expected(self._keys[request_id], req.sampling.max_tokens)
        return max(1.0, expected - req.num_output_tokens)

    def _step_s(self, view: ModelView, state: ModelState, estimator: RCTEstimator) -> float:
        """One decode step of the instance's running batch at its learned speed."""
        stats = view.load.stats
        return estimator.cost.decode_time(str(view.index), state.device,
                                          max(1, stats.num_running), DEFAULT_CONTEXT_TOKENS)

    def _unplace(self, request_id: str) -> int | None:
        """Forget where a request was placed; the instance it was on, if any."""
        self._requests.pop(request_id, None)
        index = self._placed.pop(request_id, None)
        if index is not None:
            self._deadlines.get(index, {}).pop(request_id, None)
        return index

    def _queued(self, req: Request, default_model: str) -> QueuedRequest:
        slo = req.slo
        budget = slo.deadline if slo.deadline is not None else self.default_deadline
        return QueuedRequest(req.request_id, req.model or default_model, f"{budget:g}s",
                             req.arrival_time, req.arrival_time + budget,
                             req.num_prompt_tokens, req.sampling.max_tokens)

    def _qlm_view(self, view: ModelView, state: ModelState, share: int,
                  running: Sequence[RunningRequest] = ()) -> QLMView:
        """The estimator's view of an instance; `running`: the requests placed on it
        that run now, whose earliest expected finish frees its first batch slot."""
        load = view.load
        stats = load.stats
        used = (stats.num_blocks - stats.num_free_blocks) * state.block_size
        return QLMView(
            instance_id=str(view.index), models_on_device=(state.device,),
            models_on_host=state.host,
            token_capacity=max(1, stats.num_blocks * state.block_size),
            throughput=self._throughput(view, state, share),
            device_memory_bytes=state.device_memory_bytes,
            host_link_bandwidth=state.host_link_bandwidth,
            disk_bandwidth=state.disk_bandwidth, num_running_tokens=max(0, used),
            busy_s=self._blocking_s(view, state) + state.loading_s,
            avg_batch_size=self._batch_size(stats, share),
            host_memory_bytes=state.host_memory_bytes or None,
            free_slots=max(0, stats.max_num_seqs - stats.num_requests),
            first_finish_s=min((r.remaining_s for r in running), default=None))

    def _throughput(self, view: ModelView, state: ModelState, share: int
                    ) -> dict[str, float]:
        """Θ (eq. 2) of each model the instance has generated tokens of, as measured
        (speed.py), at the batch it will run; the others' Θ comes from the cost model."""
        if not self.learn_speed or self._base_cost is None:
            return {}
        iid, batch = str(view.index), self._batch_size(view.load.stats, share)
        out = {}
        for model in state.costs:
            factor = self.speed.throughput_factor((iid, model))
            if factor is not None:
                step = self._base_cost.decode_time(iid, model, batch, DEFAULT_CONTEXT_TOKENS)
                out[model] = batch / (step * factor)
        return out

    def _drain_s(self, view: ModelView, state: ModelState) -> float:
        """The instance's own drain-time prediction at its learned speed."""
        return view.load.drain_time * self._slowdown(view.index, state.device)

    def _blocking_s(self, view: ModelView, state: ModelState) -> float:
        """How long the instance's current work holds back the queue (W_q's start):
        continuous batching starts a queued request as soon as a slot is free, so only
        the share of the drain in proportion to the occupied batch slots counts."""
        stats = view.load.stats
        occupancy = min(1.0, stats.num_requests / max(1, stats.max_num_seqs))
        return self._drain_s(view, state) * occupancy

    def _slowdown(self, index: int, model: str) -> float:
        """How much slower than its cost model the instance decodes `model` (learned)."""
        return self.speed.decode_factor((str(index), model)) if self.learn_speed else 1.0

    @staticmethod
    def _batch_size(stats: SchedulerStats, num_queued: int) -> int:
        """The batch the instance will run (d of eq. 4 is one decode step of it, Θ its
        token rate): what it runs now plus its share of the queue, up to its limit."""
        return max(1, min(max(stats.max_num_seqs, 1), stats.num_running + num_queued))

    def _estimator(self, states: dict[int, ModelState]) -> RCTEstimator:
        costs = {(str(i), m): c for i, s in states.items() for m, c in s.costs.items()}
        sizes = {m: b for s in states.values() for m, b in s.weight_bytes.items()}
        self._base_cost = CostModelTable(costs)
        cost: ExecutionCost = LearnedCost(self._base_cost, self.speed) \
            if self.learn_speed else self._base_cost
        epsilon = (lambda iid, model: self.speed.epsilon((iid, model))) \
            if self.learn_speed else None
        return RCTEstimator(cost, self.outputs, sizes, epsilon=epsilon,
                            admission_cost=self._base_cost)

    def _pull_tokens(self, view: ModelView, state: ModelState) -> int:
        """Prompt tokens the instance can pull now (0: none; agents.QLMAgents.pull_room)."""
        if not self.agent_options.pull or state.loading_s > 0:
            return 0
        return self.agents.pull_room(view)[1]

    def _queues(self, groups: Sequence[RequestGroup], views: dict[int, QLMView],
                estimator: RCTEstimator, servable: dict[int, frozenset[str]],
                room: dict[int, int] | None = None) -> dict[int, list[RequestGroup]]:
        """Each group on its planned instance or (load balancing) where it is expected
        to finish first; planned groups in plan order, then by deadline. `room`: the
        prompt tokens each instance can pull now (`_rebalanced`); a group moved there
        from its planned instance ranks after the target's planned groups (its plan
        position is of another instance's plan) and is recorded in `_moved`."""
        queues: dict[int, list[RequestGroup]] = {i: [] for i in views}
        self._moved = set()
        drains = {i: v.busy_s for i, v in views.items()}
        room = dict(room or {})
        for group in sorted(groups, key=lambda g: g.deadline):
            where = self._placement(group, views, drains, estimator, servable, queues)
            if self.load_balance:  # the ablation keeps its static instance per model
                target = self._rebalanced(group, where, views, room)
                if target != where:
                    self._moved.add(group.group_id)
                where = target
            queues[where].append(group)
            theta = estimator.throughput(views[where], group.model)
            drains[where] += group.expected_output_tokens / theta
        for index, queue in queues.items():
            queue.sort(key=lambda g: (self._plan_position(g.group_id, index), g.deadline))
        return queues

    def _plan_position(self, group_id: str, index: int) -> float:
        """The group's position in instance `index`'s plan (inf: not planned there)."""
        planned = self._order.get(group_id)
        return planned[1] if planned is not None and planned[0] == index else math.inf

    def _placement(self, group: RequestGroup, views: dict[int, QLMView],
                   drains: dict[int, float], estimator: RCTEstimator,
                   servable: dict[int, frozenset[str]],
                   queues: dict[int, list[RequestGroup]]) -> int:
        """The planned instance, else (LSO 4) the one where the group would finish
        first: its queue's drain plus a model swap unless the model is already on the
        device or queued there; without load balancing, a static instance per model."""
        planned = self._order.get(group.group_id)
        if planned is not None and planned[0] in views and group.model in servable[planned[0]]:
            return planned[0]
        fits = [i for i in views if group.model in servable[i]]
        if not self.load_balance:
            return fits[zlib.crc32(group.model.encode()) % len(fits)]  # static, by model

        def finish(i: int) -> tuple[float, int]:
            queued = any(g.model == group.model for g in queues[i])
            swap = 0.0 if queued else estimator.model_load_time(views[i], group.model)
            return drains[i] + swap, i

        return min(fits, key=finish)

    def _rebalanced(self, group: RequestGroup, where: int, views: dict[int, QLMView],
                    room: dict[int, int]) -> int:
        """Re-balance on the instances' state now (§5: agents pull when they have spare
        capacity; LSO 4): a group whose instance cannot pull now goes to one that can,
        with its model on the device, while that instance's pull budget lasts (`room`,
        spent here in deadline order). A plan's assignment, made on the estimator's
        state at the plan, otherwise held until the next plan: at 64 req/s on W_B, 16
        requests went at t = 11.2 s to the instance running 86 against the other's 43.
        Requests already pulled stay where they run (no preemptive migration, §5)."""
        if room.get(where, 0) > 0 or not room:
            self._spend(room, where, group)
            return where
        free = [i for i, r in room.items() if r > 0 and views[i].tier(group.model) == "device"]
        if not free:
            return where
        target = max(free, key=lambda i: (room[i], -i))
        self._spend(room, target, group)
        return target

    @staticmethod
    def _spend(room: dict[int, int], index: int, group: RequestGroup) -> None:
        if index in room:
            room[index] = max(0, room[index] - sum(group.prompt_tokens))

    # ---- estimator and plan generator ---------------------------------------------------
    def _plan_if_late(self, groups: Sequence[RequestGroup],
                      queues: dict[int, list[RequestGroup]], views: dict[int, QLMView],
                      estimator: RCTEstimator, now: float,
                      holds: dict[int, frozenset[str]]) -> bool:
        """Plan when the estimator expects a violation that a plan could avoid; True if
        the orders changed."""
        if not self._violates(queues, views, estimator, now, holds):
            return False
        plan = generate_plan(groups, [views[i] for i in views], estimator, now, self.options)
        self._next_plan = now + self.replan_interval  # deterministic: no wall clock
        self.counters.num_invocations += 1
        if plan.fallback:
            self.counters.num_fallbacks += 1
            log.warning("qlm: %s", plan.reason)
        else:
            self.counters.num_plans += 1
        if plan.needs_capacity:
            self.counters.num_needs_capacity += 1
            log.info("qlm: %s", plan.reason)
        self._order = {gid: (int(vq.instance_id), pos) for vq in plan.queues
                       for pos, gid in enumerate(vq.group_ids)}
        return True

    def _violates(self, queues: dict[int, list[RequestGroup]], views: dict[int, QLMView],
                  estimator: RCTEstimator, now: float,
                  holds: dict[int, frozenset[str]]) -> bool:
        """Estimate every queue (§6); True if a group's mean completion misses its SLO
        and a plan could avoid that: the group would meet it alone at the head of some
        instance that holds its model (that instance's current work evicted, its model
        loaded). A group that misses even there is hopeless (§A.3: more capacity is
        needed); no order saves it, so it does not invoke the planner. Measured on W_A
        at 9 req/s: 39 of 45 invocations saw only hopeless groups late."""
        rng = np.random.default_rng(self.options.seed)
        for index, queue in queues.items():
            if not queue:
                continue
            est = estimator.queue_times(views[index], queue, self.options.num_samples, rng)
            for group, mean in zip(queue, est.mean, strict=True):
                if now + mean > group.deadline and self._savable(group, views, estimator,
                                                                 now, holds, rng):
                    return True
        return False

    def _savable(self, group: RequestGroup, views: dict[int, QLMView],
                 estimator: RCTEstimator, now: float, holds: dict[int, frozenset[str]],
                 rng: np.random.Generator) -> bool:
        """Would `group` meet its SLO alone at the head of some instance holding its
        model (mean over S samples, eq. 5, plus the model's load)?"""
        for index, view in views.items():
            if group.model not in holds[index]:
                continue
            times = estimator.group_times(view, group, self.options.num_samples, rng)
            alone = estimator.model_load_time(view, group.model) + float(times.completion.mean())
            if now + alone <= group.deadline:
                return True
        return False

    def _predict_new(self, queues: dict[int, list[RequestGroup]], views: dict[int, QLMView],
                     estimator: RCTEstimator, now: float) -> None:
        """The estimator's first prediction of each new request's start (W_q, eq. 2) and
        completion (its group's, eq. 5), kept for its accuracy (R², Fig. 17): made on
        the queues this dispatch acts on, after any plan reordered them, and on the
        queue as it stands once every request of the same instant has arrived (a burst
        reaches the router one request per dispatch at one time; Algorithm 1 clusters
        the whole of it, so a prediction made before its later members joined their
        groups, ahead of earlier ones, was a prediction of another queue: measured,
        the waiting-time R² of the estimator burst was 0.13 instead of 0.8)."""
        counters, first = self.counters, self._first_predicted
        rng = np.random.default_rng(self.options.seed)
        for index, queue in queues.items():
            if not any(first.get(rid, now) == now for g in queue for rid in g.request_ids):
                continue
            est = estimator.queue_times(views[index], queue, self.options.num_samples, rng)
            for rid, done in est.completions.items():
                if first.setdefault(rid, now) == now:
                    counters.predicted[rid] = now + done
            for rid, wait in est.waits.items():
                if first[rid] == now:
                    counters.predicted_start[rid] = now + wait
