"""The instances' measured speed, learned online (QLM §6: Θ is the instance's measured
token throughput; Insight #1, §2.4: profiled over time, constant per model and
hardware).

Design note. The completion time estimator (eqs. 1-5) takes its prefill time P, its
decode step d and its throughput Θ from a cost model. A cost model describes an idle
machine: an instance on a busy or contended machine runs several times slower, and the
estimator then underestimates every completion time by that factor, so the planner sees
no violation until it is too late. We learn, per (instance, model), by how much the
instance is slower (or faster) than its cost model, separately for decode and prefill,
from what the controller already sees:
- decode (d): between two consecutive load reports of a busy instance, the engine
  steps it ran and the seconds they took, against the seconds the cost model gives as
  many decode steps at the batch it ran (b the mean of the two reports' running
  requests). Load reports are `SchedulerStats`, the same in the simulator, in-process
  and from a Ray actor;
- Θ (eq. 2: the instance's token generation throughput): over the same windows, the
  output tokens generated (the unfinished requests' output tokens, their change, plus
  the outputs of the requests that finished in the window) against the seconds the
  cost model takes to generate as many at the batch it ran, a step of b tokens at
  the estimator's
  `DEFAULT_CONTEXT_TOKENS`. Θ at a batch b' is then b' / d(b') over this factor. (Θ was
  b / d at the decode factor: the steps' prefill chunks and the running requests that
  do not advance in a step went uncounted, and Θ came out 14% above the tokens the
  estimator burst generated while its batch was full: 1,434 against 1,257 tokens/s);
- prefill: each finished request that ran unpreempted gives the time from its first
  scheduling to its first token, against the cost model's prefill of its prompt.
- ε (eq. 4, the inefficiency of continuous batching: a running request does not advance
  in every step, as prefills and preemptions interleave): each finished request's
  decode span (first to last token) against its tokens' decode steps at the learned
  step time and the batch its instance ran during that span (the reports' running
  requests, time-weighted over the span); a span the reports do not cover is not
  observed. Against the run's average batch, the requests that finished as a burst
  drained, at a batch falling from 32 to 1 while the router saw no report (it reads
  reports only while requests queue), read as fast and pulled ε to 0.59 on the
  estimator burst: every completion was then predicted 1.6x too soon;
- the average batch: the running requests of busy instances, time-weighted between
  reports (δ × this caps a request group, §4).
Each factor is a ratio of sums, observed over modelled seconds, with the cost model as
the prior worth `prior_s` seconds: factor = (Σ o_i + prior_s) / (Σ m_i + prior_s).
Observations fade with a half-life of `half_life_s` observed seconds, so the factor
follows the machine's load. `LearnedCost` applies the factors to an injected cost
model, so the estimator, the planner and the router use the learned speed without
knowing of it, in the simulator and on the real engine alike.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from andante.cluster.qlm.estimator import DEFAULT_CONTEXT_TOKENS, ExecutionCost
from andante.cluster.qlm.types import check_non_negative, check_positive
from andante.engine.stats import SchedulerStats

SpeedKey = tuple[str, str]  # (instance id, model)
SPAN_GAP = 0.1  # share of a decode span that may lie outside the reports (ε)


@dataclass(slots=True)
class FadingRatio:
    """Σ observed / Σ modelled seconds, older seconds fading, with a prior of 1."""

    observed: float = 0.0
    modelled: float = 0.0

    def observe(self, observed_s: float, modelled_s: float, half_life_s: float) -> None:
        decay = 0.5 ** (observed_s / half_life_s)
        self.observed = self.observed * decay + observed_s
        self.modelled = self.modelled * decay + modelled_s

    def factor(self, prior_s: float) -> float:
        return (self.observed + prior_s) / (self.modelled + prior_s)


@dataclass(frozen=True, slots=True)
class ReportPoint:
    """What one load report says of an instance's pace: time, engine steps so far,
    running requests, the model on its device and the mean context."""

    time: float
    num_steps: int
    num_running: int
    model: str
    context: int
    output_tokens: int = 0  # the unfinished requests' output tokens


@dataclass(slots=True)
class SpeedLearner:
    """Slowdown factors over the cost model per (instance, model), for prefill and
    decode (see the module note)."""

    prior_s: float = 1.0
    half_life_s: float = 60.0
    _prefill: dict[SpeedKey, FadingRatio] = field(default_factory=dict)
    _decode: dict[SpeedKey, FadingRatio] = field(default_factory=dict)
    _epsilon: dict[SpeedKey, FadingRatio] = field(default_factory=dict)
    _theta: dict[SpeedKey, FadingRatio] = field(default_factory=dict)
    _batch: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σ batch·s, Σ s
    _last: dict[str, ReportPoint] = field(default_factory=dict)  # instance -> point
    _pending_tokens: dict[str, int] = field(default_factory=dict)  # finished in the window
    # instance -> report times and the running batch integrated up to each (ε's batch)
    _batch_times: dict[str, list[float]] = field(default_factory=dict)
    _batch_areas: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_positive("prior_s", self.prior_s)
        check_positive("half_life_s", self.half_life_s)

    def observe_prefill(self, key: SpeedKey, observed_s: float, modelled_s: float) -> None:
        self._observe(self._prefill, key, observed_s, modelled_s)

    def observe_decode(self, key: SpeedKey, observed_s: float, modelled_s: float) -> None:
        self._observe(self._decode, key, observed_s, modelled_s)

    def _observe(self, table: dict[SpeedKey, FadingRatio], key: SpeedKey,
                 observed_s: float, modelled_s: float) -> None:
        check_non_negative("observed_s", observed_s)
        check_non_negative("modelled_s", modelled_s)
        if observed_s > 0 and modelled_s > 0:
            table.setdefault(key, FadingRatio()).observe(observed_s, modelled_s,
                                                         self.half_life_s)

    def prefill_factor(self, key: SpeedKey) -> float:
        ratio = self._prefill.get(key)
        return 1.0 if ratio is None else ratio.factor(self.prior_s)

    def decode_factor(self, key: SpeedKey) -> float:
        ratio = self._decode.get(key)
        return 1.0 if ratio is None else ratio.factor(self.prior_s)

    def observed_s(self, key: SpeedKey) -> float:
        """The (faded) decode seconds observed on `key`."""
        ratio = self._decode.get(key)
        return 0.0 if ratio is None else ratio.observed

    def observe_window(self, cost: ExecutionCost, key: SpeedKey, seconds: float,
                       num_steps: int, batch_size: float, context_len: int) -> None:
        """A busy instance ran `num_steps` steps in `seconds` at a mean batch of
        `batch_size` sequences of `context_len` tokens."""
        if num_steps <= 0 or seconds <= 0:
            return
        iid, model = key
        step = cost.decode_time(iid, model, max(1, round(batch_size)), max(1, context_len))
        self.observe_decode(key, seconds, num_steps * step)

    def observe_report(self, cost: ExecutionCost, key: SpeedKey, stats: SchedulerStats,
                       loading: bool = False, finished_tokens: int | None = None) -> None:
        """The latest load report of `key`'s instance (serving `key`'s model): a decode
        window since its previous report, if it stayed busy on the same model.
        `finished_tokens`: the output tokens of the requests the instance finished
        since its previous report (None: Θ is not measured from this report).

        A report's time is the clock's, not its last step's end: a report taken while
        a step is in flight shows time passing with no step done. Such a report does
        not end the window (its seconds would be lost, and the next window's tokens
        credited to too few seconds: measured on W_B at 32 req/s, one instance's Θ
        factor moved from 1.22 to 1.86 in one second, and the plan then put the whole
        queue on the other instance); the window, and the finished tokens reported
        during it, go on until a report that follows a step."""
        iid, model = key
        if finished_tokens:
            self._pending_tokens[iid] = self._pending_tokens.get(iid, 0) + finished_tokens
        point = ReportPoint(stats.time, stats.num_steps, stats.num_running, model,
                            stats.num_tokens // max(1, stats.num_requests),
                            stats.num_output_tokens)
        last = self._last.get(iid)
        if last is not None and (point.time <= last.time
                                 or point.num_steps == last.num_steps):
            return  # no step since: the window goes on from the older point
        self._last[iid] = point
        self._record_batch(iid, last, point)
        finished = self._pending_tokens.pop(iid, 0)
        if (last is None or last.model != model or loading
                or not (last.num_running and point.num_running)):
            return
        seconds = point.time - last.time
        decay = 0.5 ** (seconds / self.half_life_s)
        batch = (last.num_running + point.num_running) / 2
        self._batch = [self._batch[0] * decay + batch * seconds,
                       self._batch[1] * decay + seconds]
        self.observe_window(cost, key, point.time - last.time,
                            point.num_steps - last.num_steps,
                            (last.num_running + point.num_running) / 2, point.context)
        if finished_tokens is not None:
            generated = point.output_tokens - last.output_tokens + finished
            self.observe_generated(cost, key, seconds, generated, batch)

    def _record_batch(self, iid: str, last: ReportPoint | None, point: ReportPoint) -> None:
        """Integrate the instance's running batch (trapezoids between reports)."""
        times = self._batch_times.setdefault(iid, [])
        areas = self._batch_areas.setdefault(iid, [])
        area = 0.0 if last is None or not areas else areas[-1] + (
            (last.num_running + point.num_running) / 2 * (point.time - last.time))
        times.append(point.time)
        areas.append(area)

    def forget_batches_before(self, iid: str, time: float) -> None:
        """Drop the instance's batch record before `time`, the earliest first token of
        its unfinished requests (`batch_between` reads a span from the first report at
        or after its start, so no later span needs it): the record stays bounded on a
        long-running server. The areas are cumulative, so their differences stay."""
        times = self._batch_times.get(iid)
        if times:
            old = bisect.bisect_left(times, time)
            if old:
                del times[:old]
                del self._batch_areas[iid][:old]

    def batch_between(self, iid: str, start: float, end: float) -> float | None:
        """The instance's time-weighted running batch over [start, end]; None unless
        the reports cover the span but for `SPAN_GAP` of it at either end (the router
        sees reports only while requests queue: a run's drain has none)."""
        times, areas = self._batch_times.get(iid, []), self._batch_areas.get(iid, [])
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end) - 1
        gap = SPAN_GAP * (end - start)
        if hi <= lo or times[lo] - start > gap or end - times[hi] > gap:
            return None
        return (areas[hi] - areas[lo]) / (times[hi] - times[lo])

    def observe_generated(self, cost: ExecutionCost, key: SpeedKey, seconds: float,
                          num_tokens: int, batch_size: float) -> None:
        """Θ: a busy instance generated `num_tokens` output tokens in `seconds` at a mean
        batch of `batch_size` sequences."""
        if num_tokens <= 0 or seconds <= 0:
            return
        iid, model = key
        batch = max(1, round(batch_size))
        step = cost.decode_time(iid, model, batch, DEFAULT_CONTEXT_TOKENS)
        self._observe(self._theta, key, seconds, num_tokens * step / batch)

    def throughput_factor(self, key: SpeedKey) -> float | None:
        """How much slower than its cost model `key` generates tokens (None: unmeasured)."""
        ratio = self._theta.get(key)
        return None if ratio is None else ratio.factor(self.prior_s)

    def observe_first_token(self, cost: ExecutionCost, key: SpeedKey, num_prompt_tokens: int,
                            scheduled: float, token_times: Sequence[float]) -> None:
        """A finished request that ran unpreempted: first scheduling to first token."""
        if token_times:
            iid, model = key
            self.observe_prefill(key, max(0.0, token_times[0] - scheduled),
                                 cost.prefill_time(iid, model, num_prompt_tokens))

    def observe_decode_span(self, cost: ExecutionCost, key: SpeedKey, num_prompt_tokens: int,
                            token_times: Sequence[float]) -> None:
        """ε: a finished request's first-to-last-token span against its decode steps at
        `cost`'s (learned) step time and the measured average batch."""
        if len(token_times) < 2:
            return
        iid, model = key
        context = num_prompt_tokens + len(token_times) // 2
        batch = self.batch_between(iid, token_times[0], token_times[-1])
        if batch is None:
            return  # its batch is not known (the module note)
        step = cost.decode_time(iid, model, max(1, round(batch)), context)
        self._observe(self._epsilon, key, token_times[-1] - token_times[0],
                      (len(token_times) - 1) * step)

    def epsilon(self, key: SpeedKey) -> float:
        """ε of eq. 4 on `key` (1 before any measurement)."""
        ratio = self._epsilon.get(key)
        return 1.0 if ratio is None else ratio.factor(self.prior_s)

    def average_batch(self) -> float | None:
        """The measured mean running batch of busy instances (None: not measured yet)."""
        weighted, seconds = self._batch
        return None if seconds <= 0 else weighted / seconds

    def summary(self) -> dict[str, float]:
        """Each key's factors, for logs and experiment reports."""
        out: dict[str, float] = {}
        for name, table in (("decode", self._decode), ("prefill", self._prefill),
                            ("epsilon", self._epsilon), ("throughput", self._theta)):
            for (iid, model), ratio in table.items():
                out[f"{name}[{iid},{model}]"] = ratio.factor(self.prior_s)
        return out


@dataclass(frozen=True, slots=True)
class LearnedCost:
    """`ExecutionCost`: `base` scaled by the learned factors of each (instance, model)."""

    base: ExecutionCost
    speed: SpeedLearner

    def prefill_time(self, instance_id: str, model: str, num_tokens: int) -> float:
        return (self.base.prefill_time(instance_id, model, num_tokens)
                * self.speed.prefill_factor((instance_id, model)))

    def decode_time(self, instance_id: str, model: str, batch_size: int,
                    context_len: int) -> float:
        return (self.base.decode_time(instance_id, model, batch_size, context_len)
                * self.speed.decode_factor((instance_id, model)))
