"""Request completion time (RCT) estimator (QLM §6, eqs. 1-5; Insight #1 of §2.4).

Design note. A request's completion time is C_q = W_q + P + D_q (eq. 1). The waiting time
is the output tokens ahead of it divided by the instance's token throughput,
W_q = Σ_{i<q} O_i / Θ (eq. 2), Θ taken as constant per (instance, model) (Insight #1).
Output lengths are unknown, so O ~ N(μ_o, σ_o) per request group (eq. 3); the paper fits
μ_o, σ_o offline, we fit them online from finished requests per group key with a
normal-inverse-gamma-style prior (a prior mean and std worth `prior_weight`
pseudo-observations), i.e. the posterior-mean estimates after n observations are
μ = (w·μ0 + n·x̄)/(w + n) and σ² = (w·σ0² + M2 + w·n/(w+n)·(x̄ − μ0)²)/(w + n).
Prefill P comes from the injected cost model for the request's own prompt (the paper
takes it constant per model, §6; ours keeps the length dependence), decode time is
D_q = O_q · ε · d (eq. 4), d one decode step of the instance's average batch. A group's
completion time is the max over its members (eq. 5), sampled S times for the planner's
sample-average approximation (§7). In a queue (`RCTEstimator.queue_times`) two terms
of continuous batching are added to eq. 2: a request entering a free batch slot waits
for the prefills of those admitted before it, and the first request with no free slot
waits for the running batch's earliest finish (and for those admissions to end), which
eq. 2 alone, draining tokens at Θ from now, leaves out. Model swap time (§5 warm
start, §7 footnote 2) is added where the group's model is not on the device: weights /
PCIe bandwidth from host memory (warm), plus weights / disk bandwidth from disk (cold).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from andante.cluster.qlm.groups import RequestGroup
from andante.cluster.qlm.types import InstanceView, check_non_negative, check_positive
from andante.metrics.sketch import Moments
from andante.perf.cost_model import CostModel

DEFAULT_CONTEXT_TOKENS = 1024  # context of the decode step used to derive Θ when not given


class ExecutionCost(Protocol):
    """Seconds of execution of `model` on instance `instance_id` (injected cost model).

    `prefill_time` is one step prefilling `num_tokens` prompt tokens; `decode_time` one
    decode step of `batch_size` sequences of `context_len` tokens each.
    """

    def prefill_time(self, instance_id: str, model: str, num_tokens: int) -> float: ...

    def decode_time(self, instance_id: str, model: str, batch_size: int,
                    context_len: int) -> float: ...


@dataclass(frozen=True, slots=True)
class CostModelTable:
    """`ExecutionCost` backed by one `andante.perf.cost_model.CostModel` per (instance, model)."""

    models: Mapping[tuple[str, str], CostModel]

    def _get(self, instance_id: str, model: str) -> CostModel:
        try:
            return self.models[(instance_id, model)]
        except KeyError:
            raise ValueError(f"no cost model for instance {instance_id!r}, "
                             f"model {model!r}") from None

    def prefill_time(self, instance_id: str, model: str, num_tokens: int) -> float:
        return self._get(instance_id, model).prefill_time(num_tokens)

    def decode_time(self, instance_id: str, model: str, batch_size: int,
                    context_len: int) -> float:
        return self._get(instance_id, model).decode_time(batch_size, context_len)


@dataclass(slots=True)
class OutputLengthModel:
    """Online normal fit of output lengths per group key (eq. 3), with a prior.

    The fit is on the capped scale: an observed output ended at its EOS or at its own
    max_tokens, so the moments already hold the caps of the key's requests. A request's
    own max_tokens therefore caps its estimate only where it is below every cap the key
    has seen (`caps`): there min(draw, cap) is exact, since each observed output was
    min(its length, a cap >= this one); above it, capping again counts caps twice (on
    the estimator burst, where every request runs to its max_tokens, capped draws
    averaged 279 tokens against 416 observed). Before any observation the prior is of
    uncapped lengths, so the cap applies.
    """

    prior_mean: float = 256.0
    prior_std: float = 128.0
    prior_weight: float = 8.0
    max_tokens: int = 32768
    _stats: dict[Hashable, Moments] = field(default_factory=dict)
    _least_cap: dict[Hashable, float] = field(default_factory=dict)  # key -> its least cap
    num_observed: int = 0  # outputs observed so far: equal counts, equal moments

    def __post_init__(self) -> None:
        check_positive("prior_mean", self.prior_mean)
        check_non_negative("prior_std", self.prior_std)
        check_positive("prior_weight", self.prior_weight)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")

    def observe(self, key: Hashable, num_output_tokens: int,
                max_tokens: int | None = None) -> None:
        """Record one finished request's output length (Welford's update) and its cap
        (None: the model's limit)."""
        if num_output_tokens < 0:
            raise ValueError(f"num_output_tokens must be >= 0, got {num_output_tokens!r}")
        self._stats.setdefault(key, Moments()).observe(num_output_tokens)
        cap = float(self.max_tokens if max_tokens is None else max_tokens)
        self._least_cap[key] = min(self._least_cap.get(key, math.inf), cap)
        self.num_observed += 1

    def caps(self, key: Hashable, max_tokens: int | None) -> bool:
        """Does a request's own `max_tokens` cap its estimate under `key` (class note)?"""
        return max_tokens is not None and max_tokens < self._least_cap.get(key, math.inf)

    def expected(self, key: Hashable, max_tokens: int | None) -> float:
        """A request's expected output: its key's mean, capped where `caps` says."""
        mean = self.mean(key)
        if max_tokens is None or not self.caps(key, max_tokens):
            return mean
        return min(mean, float(max_tokens))

    def distribution(self, key: Hashable) -> tuple[float, float]:
        """(μ_o, σ_o) after the observations so far (the prior alone before any)."""
        s = self._stats.get(key)
        w, mu0, var0 = self.prior_weight, self.prior_mean, self.prior_std ** 2
        if s is None or s.count == 0:
            return mu0, math.sqrt(var0)
        n = s.count
        mean = (w * mu0 + n * s.mean) / (w + n)
        var = (w * var0 + s.m2 + w * n / (w + n) * (s.mean - mu0) ** 2) / (w + n)
        return mean, math.sqrt(var)

    def mean(self, key: Hashable) -> float:
        return self.distribution(key)[0]

    def sample(self, key: Hashable, shape: tuple[int, ...], rng: np.random.Generator,
               cap: int | None = None,
               member_caps: Sequence[int | None] = ()) -> np.ndarray:
        """Output lengths drawn from N(μ_o, σ_o), clipped to [1, cap or max_tokens];
        `member_caps` (one per column of `shape`): each member's max_tokens, which caps
        its column where `caps` says (class note)."""
        mu, sigma = self.distribution(key)
        upper = min(cap, self.max_tokens) if cap is not None else self.max_tokens
        draws = np.clip(rng.normal(mu, sigma, size=shape), 1.0, float(upper))
        for i, c in enumerate(member_caps):
            if c is not None and self.caps(key, c):
                np.minimum(draws[..., i], float(c), out=draws[..., i])
        return draws


@dataclass(frozen=True, slots=True)
class GroupTimes:
    """S samples of one group on one instance, from the moment the group starts.

    `drain` is the time the group holds the instance (Σ O / Θ, its share of eq. 2 for the
    groups behind it); `completion` its own completion time (eq. 5).
    """

    drain: np.ndarray
    completion: np.ndarray
    waiting: np.ndarray | None = None  # [S, members]: eq. 2 inside the group (FCFS)


@dataclass(frozen=True, slots=True)
class QueueEstimate:
    """Completion times of the groups of one virtual queue, in queue order."""

    group_ids: tuple[str, ...]
    samples: np.ndarray  # [num_groups, S], seconds from now
    waits: Mapping[str, float] = field(default_factory=dict)  # request id -> mean W_q
    # request id -> its own mean completion C_q (eq. 1); `samples` are the groups' (eq. 5)
    completions: Mapping[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> tuple[float, ...]:
        return tuple(float(v) for v in self.samples.mean(axis=1))


@dataclass(frozen=True, slots=True)
class RCTEstimator:
    """Samples completion times of request groups on instances (§6)."""

    cost: ExecutionCost
    outputs: OutputLengthModel
    model_bytes: Mapping[str, int]
    inefficiency: float = 1.0  # ε of eq. 4 (a constant)
    epsilon: Callable[[str, str], float] | None = None  # ε per (instance, model): profiled
    # the prefill compute an admission waits for (`queue_times`); None: `cost`. The router
    # passes its cost model without the learned prefill factor: that factor is measured
    # from first scheduling to first token, which holds the other prompts prefilled in
    # the same steps, so a sum of learned prefills counts them twice (on the estimator
    # burst, 31 admissions were predicted to take 5.9 s against 3.0 s observed; 3.0 s at
    # the cost model).
    admission_cost: ExecutionCost | None = None

    def __post_init__(self) -> None:
        check_positive("inefficiency", self.inefficiency)
        for model, size in self.model_bytes.items():
            check_positive(f"model_bytes[{model!r}]", size)

    def throughput(self, view: InstanceView, model: str) -> float:
        """Θ: the view's figure, else a full average batch's decode rate from the cost model."""
        theta = view.throughput.get(model)
        if theta is not None:
            return theta
        step = self.cost.decode_time(view.instance_id, model, view.avg_batch_size,
                                     DEFAULT_CONTEXT_TOKENS)
        check_positive("decode_time", step)
        return view.avg_batch_size / step

    def weight_bytes(self, model: str) -> int:
        try:
            return self.model_bytes[model]
        except KeyError:
            raise ValueError(f"unknown model {model!r}; "
                             f"known: {sorted(self.model_bytes)}") from None

    def swap_in_time(self, view: InstanceView, model: str) -> float:
        """Loading `model` onto the device: warm from host (or a model swapped out of the
        device to host), cold from disk (disk -> host, then host -> device)."""
        size = self.weight_bytes(model)
        warm = size / view.host_link_bandwidth
        return warm if view.tier(model) != "disk" else warm + size / view.disk_bandwidth

    def model_load_time(self, view: InstanceView, model: str) -> float:
        """Swap time before serving `model` next: zero when it is on the device."""
        return 0.0 if view.tier(model) == "device" else self.swap_in_time(view, model)

    def sample_outputs(self, group: RequestGroup, num_samples: int,
                       rng: np.random.Generator) -> np.ndarray:
        """[S, members] output lengths of `group` drawn from its key's learned N(μ_o, σ_o)
        (eq. 3), each member's capped at its max_tokens where that is below every cap
        the key has seen (`OutputLengthModel`)."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples!r}")
        return self.outputs.sample(group.key, (num_samples, group.num_requests), rng,
                                   member_caps=group.max_output_tokens)

    def group_times(self, view: InstanceView, group: RequestGroup, num_samples: int,
                    rng: np.random.Generator, outputs: np.ndarray | None = None,
                    memo: dict[tuple[object, ...], Any] | None = None) -> GroupTimes:
        """S samples of eqs. 1-5 for `group` run at the head of `view`'s queue; pass
        `outputs` ([S, members], from `sample_outputs`) to reuse one draw across instances
        and `memo` to share the cost model's answers across the groups of one queue."""
        memo = {} if memo is None else memo
        outs = self.sample_outputs(group, num_samples, rng) if outputs is None else outputs
        drain, completion = self.times_across([view], group, outs, memo)
        theta = memo[("theta", view.instance_id, group.model)]  # set by times_across
        waiting = (np.cumsum(outs, axis=1) - outs) / theta
        return GroupTimes(drain=drain[0], completion=completion[0], waiting=waiting)

    def times_across(self, views: Sequence[InstanceView], group: RequestGroup,
                     outputs: np.ndarray, memo: dict[tuple[object, ...], Any] | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """(drain, completion), each [views, S]: `group` at the head of each view's queue,
        for one draw of its `outputs` ([S, members]) shared by every view (common random
        numbers), in one array computation over the views. `memo` keeps the cost model's
        answers (Θ, prefill and decode steps) across the groups of one plan."""
        drain, completion = self.member_times(views, group, outputs, memo)
        return drain, completion.max(axis=2)  # eq. 5

    def member_times(self, views: Sequence[InstanceView], group: RequestGroup,
                     outputs: np.ndarray, memo: dict[tuple[object, ...], Any] | None = None,
                     started: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(drain [views, S], completion [views, S, members]) of `times_across`, per
        member; the first `started` members take free batch slots: they start at once,
        so they wait for no output (eq. 2 counts the queue ahead, and they are not in
        it) and hold no one back (the drain is the other members')."""
        memo = {} if memo is None else memo
        model = group.model
        prompts = group.prompt_tokens
        lengths = sorted(set(prompts))  # np.unique's values and inverse, without its cost
        index = {p: i for i, p in enumerate(lengths)}
        where = np.fromiter((index[p] for p in prompts), dtype=np.intp, count=len(prompts))
        mean_key = ("output mean", group.key)
        if mean_key not in memo:
            memo[mean_key] = self.outputs.mean(group.key)
        # an int tuple's float sum is exact: the same value as np.mean's
        context = max(1, int(sum(prompts) / len(prompts) + memo[mean_key] / 2))
        key = ("views", model, context, tuple(lengths), tuple(v.instance_id for v in views))
        costs = memo.get(key)
        if costs is None:  # groups of one model and prompt shape share the views' costs
            rows = [self._view_costs(v, model, context, lengths, memo) for v in views]
            costs = memo[key] = (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                                 np.array([r[2] for r in rows]).reshape(len(views), -1))
            if self.epsilon is not None:
                costs = memo[key] = (costs[0], costs[1] * np.array(
                    [self.epsilon(v.instance_id, model) for v in views]), costs[2])
        theta, step, prefill = costs
        queued = outputs[:, started:] if started else outputs
        ahead = np.cumsum(queued, axis=1) - queued  # eq. 2 inside the group (FCFS)
        if started:
            ahead = np.concatenate([np.zeros((len(outputs), started)), ahead], axis=1)
        completion = (ahead[None] / theta[:, None, None] + prefill[:, where][:, None, :]
                      + outputs[None] * (self.inefficiency * step)[:, None, None])  # eq. 4
        drain = queued.sum(axis=1)[None, :] / theta[:, None]
        return drain, completion  # eq. 1

    def _view_costs(self, view: InstanceView, model: str, context: int, lengths: Sequence[int],
                    memo: dict[tuple[object, ...], Any]) -> tuple[float, float, list[float]]:
        """Θ, one decode step at `context` and the prefill of each prompt length, for
        `model` on `view` (memoised by instance id)."""
        iid = view.instance_id
        keys = [("theta", iid, model), ("decode", iid, model, view.avg_batch_size, context)]
        if keys[0] not in memo:
            memo[keys[0]] = self.throughput(view, model)
        if keys[1] not in memo:
            memo[keys[1]] = self.cost.decode_time(iid, model, view.avg_batch_size, context)
        prefill = []
        for p in lengths:
            key = ("prefill", iid, model, p)
            if key not in memo:
                memo[key] = self.cost.prefill_time(iid, model, p)
            prefill.append(memo[key])
        return memo[keys[0]], memo[keys[1]], prefill

    def queue_times(self, view: InstanceView, groups: Sequence[RequestGroup], num_samples: int,
                    rng: np.random.Generator) -> QueueEstimate:
        """Completion times (from now) of `groups` served in this order on `view` (eq. 10).
        The first `view.free_slots` requests of the queue take the free batch slots
        (continuous batching admits them into the running batch: `member_times`),
        unless their model must be loaded first; every later request waits for the
        instance's current work (`busy_s`) and, by eq. 2, the output of the queued
        requests ahead of it.

        Two terms of continuous batching that eq. 2 as the paper states it (W_q =
        Σ_{i<q} O_i / Θ over the requests ahead: the instance as a server draining
        tokens at Θ from now) leaves out, both measured on the estimator burst (one
        instance, 32 slots, 150 requests at one instant), where eq. 2 alone
        under-predicted the mean wait by 2.9 s:
        - the requests that take free slots are prefilled one after another (the
          step's token budget holds a few prompts): each waits for the prefill of those
          admitted before it (there, 31 admissions took 2.9 s, in 4 steps);
        - with no slot free, the queue cannot start before the running batch frees its
          first slot, nor before those admissions are done (an agent pulls only when
          its instance has no backlog: andante.cluster.qlm.agents): the first queued
          request starts no earlier than the earliest finish among the requests
          running (`view.first_finish_s`) and those that took the free slots (their
          sampled completions), nor than the prefills of the latter. There the
          earliest finish was at 2.4 s, and the first queued request started at 3.0 s,
          as the admissions ended."""
        ahead = np.full(num_samples, view.busy_s)
        first_free = np.full(num_samples, math.inf if view.first_finish_s is None
                             else view.first_finish_s)
        gated = False  # has the queue's first request waited for a slot yet?
        prefill_ahead = 0.0  # of the requests admitted into free slots so far
        out = np.zeros((len(groups), num_samples))
        previous: str | None = None
        waits: dict[str, float] = {}
        completions: dict[str, float] = {}
        memo: dict[tuple[object, ...], Any] = {}
        free = view.free_slots
        for j, group in enumerate(groups):
            if previous is None:
                swap = self.model_load_time(view, group.model)
            else:
                swap = 0.0 if group.model == previous else self.swap_in_time(view, group.model)
            started = min(free, group.num_requests) if swap == 0.0 else 0
            free = free - started if swap == 0.0 else 0
            outs = self.sample_outputs(group, num_samples, rng)
            drain, member = self.member_times([view], group, outs, memo, started)
            theta = memo[("theta", view.instance_id, group.model)]
            start = np.repeat((ahead + swap)[:, None], group.num_requests, axis=1)
            if started:
                prefills = self._admission_prefills(view, group, started, memo)
                start[:, :started] = swap + prefill_ahead + np.cumsum(prefills) - prefills
                prefill_ahead += float(prefills.sum())
                done = start[:, :started] + member[0][:, :started]
                first_free = np.minimum(first_free, done.min(axis=1))
            if not gated and started < group.num_requests:
                gated = True
                slot = np.where(np.isfinite(first_free), first_free, 0.0)
                ahead = np.maximum(ahead, np.maximum(slot, prefill_ahead))
                start[:, started:] = (ahead + swap)[:, None]
            own = start + member[0]  # eq. 1 per member
            out[j] = own.max(axis=1)  # eq. 5
            completions.update(zip(group.request_ids, own.mean(axis=0).tolist(), strict=True))
            queued = outs[:, started:]
            within = np.zeros_like(outs)
            within[:, started:] = (np.cumsum(queued, axis=1) - queued) / theta
            member_wait = start + within  # eq. 2 over every queued request ahead, from now
            waits.update(zip(group.request_ids, member_wait.mean(axis=0).tolist(), strict=True))
            ahead = ahead + swap + drain[0]
            previous = group.model
        return QueueEstimate(tuple(g.group_id for g in groups), out, waits, completions)

    def _admission_prefills(self, view: InstanceView, group: RequestGroup, started: int,
                            memo: dict[tuple[object, ...], Any]) -> np.ndarray:
        """The compute time of the prompts of `group`'s first `started` members, at
        `admission_cost` (`queue_times`: the prefills a later admission waits for)."""
        cost = self.admission_cost or self.cost
        times = []
        for p in group.prompt_tokens[:started]:
            key = ("admission prefill", view.instance_id, group.model, p)
            if key not in memo:
                memo[key] = cost.prefill_time(view.instance_id, group.model, p)
            times.append(memo[key])
        return np.array(times)


def waiting_time(output_tokens_ahead: Sequence[float], throughput: float) -> float:
    """Eq. 2: W_q = Σ_{i<q} O_i / Θ for the output lengths of the requests ahead."""
    check_positive("throughput", throughput)
    for o in output_tokens_ahead:
        check_non_negative("output tokens", o)
    return float(sum(output_tokens_ahead)) / throughput


def r_squared(predicted: Sequence[float] | np.ndarray,
              observed: Sequence[float] | np.ndarray) -> float:
    """Coefficient of determination of `predicted` against `observed` (Fig. 17)."""
    pred, obs = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    if pred.shape != obs.shape or pred.ndim != 1 or len(obs) < 2:
        raise ValueError(f"need two equal-length 1-D series of >= 2 values, "
                         f"got shapes {pred.shape} and {obs.shape}")
    ss_tot = float(((obs - obs.mean()) ** 2).sum())
    if ss_tot == 0.0:
        raise ValueError("observed values are all equal; R² is undefined")
    return 1.0 - float(((obs - pred) ** 2).sum()) / ss_tot


