"""The learned instance speed (QLM §6: Θ measured) and the estimator that uses it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from andante.cluster.instance import ModelState
from andante.cluster.load import LoadReport
from andante.cluster.qlm import r_squared
from andante.cluster.qlm.router import QLMRouter
from andante.cluster.qlm.speed import LearnedCost, SpeedLearner
from andante.cluster.router import QueueDecision
from andante.core.request import Request
from andante.engine.stats import SchedulerStats
from andante.perf.catalog import get_hardware
from andante.perf.cost_model import CostModel
from andante.sim import ClusterSpec, simulate
from andante.sim.setup import with_router
from andante.workload.mixes import assign_deadlines
from andante.workload.spec import RequestSpec
from tests.cluster.qlm.helpers import FlatCost

KEY = ("0", "m1")


def test_the_cost_model_is_the_prior_before_any_observation() -> None:
    speed = SpeedLearner()
    assert speed.decode_factor(KEY) == speed.prefill_factor(KEY) == 1.0
    cost = LearnedCost(FlatCost(prefill_s=0.5, step_s=0.01), speed)
    assert cost.prefill_time("0", "m1", 10) == 0.5
    assert cost.decode_time("0", "m1", 4, 100) == 0.01


def test_observations_move_the_factor_towards_the_measured_slowdown() -> None:
    speed = SpeedLearner(prior_s=1.0)
    factors = []
    for _ in range(100):
        speed.observe_decode(KEY, 0.5, 0.1)  # five times slower than modelled
        factors.append(speed.decode_factor(KEY))
    assert all(b > a for a, b in zip(factors, factors[1:], strict=False))  # monotone
    assert 1.0 < factors[0] < 5.0 and factors[-1] == pytest.approx(5.0, rel=0.1)
    assert speed.prefill_factor(KEY) == 1.0  # prefill and decode are learned apart
    assert speed.decode_factor(("1", "m1")) == 1.0  # and per instance
    cost = LearnedCost(FlatCost(step_s=0.01), speed)
    assert cost.decode_time("0", "m1", 4, 100) == pytest.approx(0.01 * factors[-1])


def test_old_observations_fade() -> None:
    speed = SpeedLearner(prior_s=0.1, half_life_s=8.0)
    for _ in range(64):
        speed.observe_decode(KEY, 4.0, 1.0)
    assert speed.decode_factor(KEY) > 3.5
    for _ in range(64):
        speed.observe_decode(KEY, 1.0, 1.0)  # the machine got quiet again
    assert speed.decode_factor(KEY) < 1.1
    assert speed.observed_s(KEY) == pytest.approx(1 / (1 - 0.5 ** (1 / 8)), rel=0.01)


@given(st.lists(st.tuples(st.floats(min_value=1e-3, max_value=1e3),
                          st.floats(min_value=1e-3, max_value=1e3)), min_size=1, max_size=50))
def test_the_factor_stays_between_the_prior_and_the_observed_ratios(
        pairs: list[tuple[float, float]]) -> None:
    speed = SpeedLearner()
    for observed, modelled in pairs:
        speed.observe_prefill(KEY, observed, modelled)
    ratios = [o / m for o, m in pairs]
    factor = speed.prefill_factor(KEY)
    assert min(1.0, *ratios) * (1 - 1e-9) <= factor <= max(1.0, *ratios) * (1 + 1e-9)


def test_windows_and_first_tokens_are_measured_against_the_cost_model() -> None:
    speed = SpeedLearner(prior_s=1e-9)
    flat = FlatCost(prefill_s=0.1, step_s=0.01)
    # 8 sequences, 10 steps in 0.3 s where the model says 0.1 s
    speed.observe_window(flat, KEY, seconds=0.3, num_steps=10, batch_size=8.0,
                         context_len=200)
    assert speed.decode_factor(KEY) == pytest.approx(3.0)
    speed.observe_first_token(flat, KEY, 100, scheduled=1.0, token_times=[1.2, 1.25])
    assert speed.prefill_factor(KEY) == pytest.approx(2.0)
    speed.observe_window(flat, ("2", "m1"), 1.0, 0, 8.0, 200)  # nothing produced
    speed.observe_first_token(flat, ("2", "m1"), 100, 1.0, [])
    assert speed.summary() == {"decode[0,m1]": speed.decode_factor(KEY),
                               "prefill[0,m1]": speed.prefill_factor(KEY)}


def test_load_reports_give_decode_windows_while_the_instance_stays_busy() -> None:
    speed = SpeedLearner(prior_s=1e-9)
    flat = FlatCost(step_s=0.01)

    def report(time: float, steps: int, running: int) -> SchedulerStats:
        return SchedulerStats(time=time, num_steps=steps, num_running=running,
                              num_tokens=400 * running, max_num_seqs=16)

    speed.observe_report(flat, KEY, report(10.0, 100, 4))
    speed.observe_report(flat, KEY, report(10.0, 100, 4))  # no step since: nothing
    assert speed.decode_factor(KEY) == 1.0
    speed.observe_report(flat, KEY, report(10.5, 110, 4))  # 10 steps in 0.5 s: 5x
    assert speed.decode_factor(KEY) == pytest.approx(5.0)
    speed.observe_report(flat, ("0", "m2"), report(20.0, 3, 4))  # swapped: a new engine
    speed.observe_report(flat, ("0", "m2"), report(21.0, 5, 0))  # went idle: no window
    speed.observe_report(flat, ("0", "m2"), report(30.0, 6, 2))
    assert speed.decode_factor(("0", "m2")) == 1.0
    assert speed.decode_factor(KEY) == pytest.approx(5.0)


def test_bad_settings_and_observations_are_refused() -> None:
    with pytest.raises(ValueError, match="prior_s"):
        SpeedLearner(prior_s=0.0)
    with pytest.raises(ValueError, match="half_life_s"):
        SpeedLearner(half_life_s=-1.0)
    with pytest.raises(ValueError, match="observed_s"):
        SpeedLearner().observe_decode(KEY, -1.0, 1.0)
    with pytest.raises(ValueError, match="swap_hysteresis"):
        QLMRouter(swap_hysteresis=-1.0)
    with pytest.raises(ValueError, match="learn_speed must be true or false"):
        QLMRouter(learn_speed="no")  # type: ignore[arg-type]


# ---- in the simulator: instances slower than the estimator's cost model -----------------

class _FastState:
    """An instance's models as an optimistic operator describes them: each cost model
    on faster hardware than the instance runs on (as the CPU cost model of an idle
    machine describes a loaded one)."""

    def __init__(self, multi: Any, hardware: str) -> None:
        self._multi, self._hardware = multi, get_hardware(hardware)

    def model_state(self) -> ModelState:
        state: ModelState = self._multi.model_state()
        costs = {m: CostModel(c.model, self._hardware, tp=c.tp) for m, c in state.costs.items()}
        return dataclasses.replace(state, costs=costs)

    def warm_model(self, model: str) -> bool:
        return bool(self._multi.warm_model(model))


class _SlotView:
    """A controller slot whose instance reports as if it ran on `hardware`: its cost
    models and its own drain-time prediction (which it makes with its cost model)."""

    def __init__(self, slot: Any, hardware: str) -> None:
        self._slot = slot
        self.multi_model = _FastState(slot.multi_model, hardware)

    @property
    def load(self) -> LoadReport:
        load: LoadReport = self._slot.load
        stats, state = load.stats, self._slot.multi_model.model_state()
        if not stats.num_requests:
            return load
        batch, context = min(stats.num_requests, stats.max_num_seqs), stats.num_tokens
        slow = state.costs[state.device]
        fast = self.multi_model.model_state().costs[state.device]
        ratio = (fast.decode_time(batch, context // stats.num_requests)
                 / slow.decode_time(batch, context // stats.num_requests))
        return dataclasses.replace(load, drain_time=load.drain_time * ratio)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._slot, name)


class OptimisticQLM(QLMRouter):
    """The qlm router fed cost models of `estimate_on` hardware."""

    def __init__(self, estimate_on: str, **options: Any) -> None:
        super().__init__(**options)
        self.estimate_on = estimate_on

    def dispatch(self, queue: Sequence[Request], instances: Sequence[Any]) -> QueueDecision:
        return super().dispatch(queue, [_SlotView(s, self.estimate_on) for s in instances])


def _errors(learn: bool) -> tuple[float, float]:
    """(R², median relative error) of the first predicted completion time of each
    request of the second half of a run on A10s estimated as H100s."""
    spec = dataclasses.replace(
        ClusterSpec(model="mistral-7b", hardware="a10-24g", num_instances=2,
                    models=("mistral-7b",)), policy="edf")
    spec = with_router(spec, "qlm")
    workload = [RequestSpec(i * 0.12, 100 + (i * 37) % 400, 40 + (i * 53) % 200)
                for i in range(400)]
    workload = assign_deadlines(workload, 0.3, seed=2, latency_deadline=5.0,
                                batch_deadline=20.0)
    router = OptimisticQLM("h100-80g", learn_speed=learn, replan_interval=0.25)
    run = simulate(spec, workload, router=router)
    assert len(run.report.finished) == len(workload)  # nothing lost either way
    predicted = router.counters.predicted
    late = [r for r in run.report.finished if r.arrival_time >= 24.0
            and r.request_id in predicted and r.timeline.finish_time is not None]
    pred = np.array([predicted[r.request_id] - r.arrival_time for r in late])
    seen = np.array([r.timeline.finish_time - r.arrival_time for r in late])
    assert len(late) > 50
    return r_squared(pred, seen), float(np.median(np.abs(pred - seen) / seen))


def test_the_learned_estimator_beats_the_fixed_one_on_slower_instances() -> None:
    fixed_r2, fixed_error = _errors(learn=False)
    learned_r2, learned_error = _errors(learn=True)
    assert math.isfinite(fixed_r2) and math.isfinite(learned_r2)
    assert learned_r2 > fixed_r2
    assert learned_error < 0.75 * fixed_error


def test_theta_is_the_output_tokens_generated_per_busy_second() -> None:
    speed = SpeedLearner(prior_s=1e-9)
    flat = FlatCost(step_s=0.01)  # the cost model: 4 sequences -> 400 tokens/s

    def report(time: float, running: int, outputs: int) -> SchedulerStats:
        return SchedulerStats(time=time, num_steps=int(time * 100), num_running=running,
                              num_tokens=400 * running, num_output_tokens=outputs,
                              max_num_seqs=16)

    speed.observe_report(flat, KEY, report(10.0, 4, 1000), finished_tokens=0)
    assert speed.throughput_factor(KEY) is None  # one report: no window yet
    # 1 s: the unfinished requests' outputs grew by 50 and 150 tokens finished: 200 tok/s
    speed.observe_report(flat, KEY, report(11.0, 4, 1050), finished_tokens=150)
    assert speed.throughput_factor(KEY) == pytest.approx(2.0)  # half the model's 400
    assert speed.decode_factor(KEY) == pytest.approx(1.0)  # every step at its cost
    speed.observe_report(flat, ("0", "m2"), report(12.0, 4, 0))  # not measured
    assert speed.throughput_factor(("0", "m2")) is None


def test_a_report_taken_while_a_step_is_in_flight_does_not_end_the_window() -> None:
    """A report's time is the clock's: reports between two step ends show time passing
    with no step. Their seconds, and the tokens finished meanwhile, stay in the window
    that the next step ends (they were lost, and the next window's tokens credited to
    its few seconds alone)."""
    speed = SpeedLearner(prior_s=1e-9)
    flat = FlatCost(step_s=0.01)  # the cost model: 4 sequences -> 400 tokens/s

    def report(time: float, steps: int, outputs: int) -> SchedulerStats:
        return SchedulerStats(time=time, num_steps=steps, num_running=4,
                              num_tokens=1600, num_output_tokens=outputs, max_num_seqs=16)

    speed.observe_report(flat, KEY, report(10.0, 100, 1000), finished_tokens=0)
    # 0.9 s of in-flight reports (no step ends), one of them bringing 100 finished tokens
    speed.observe_report(flat, KEY, report(10.5, 100, 1000), finished_tokens=100)
    speed.observe_report(flat, KEY, report(10.9, 100, 1000), finished_tokens=0)
    assert speed.throughput_factor(KEY) is None and speed.decode_factor(KEY) == 1.0
    # the steps end at 11.0: 50 steps (0.5 s at the cost model) in 1 s; 100 + 100 tokens
    # in 1 s, against 400 tokens/s: both factors 2 (with the window cut at every
    # report, they came out 0.2 and 1.2)
    speed.observe_report(flat, KEY, report(11.0, 150, 1100), finished_tokens=0)
    assert speed.decode_factor(KEY) == pytest.approx(2.0)
    assert speed.throughput_factor(KEY) == pytest.approx(2.0)


class _BatchCost(FlatCost):
    """One decode step takes 1 ms per running sequence."""

    def decode_time(self, instance_id: str, model: str, batch_size: int,
                    context_len: int) -> float:
        return 0.001 * batch_size


def test_epsilon_is_measured_at_the_batch_of_the_span_and_only_where_reports_cover_it(
        ) -> None:
    """ε compares a request's decode span with steps at the batch its instance ran
    then; a span past the last report (the drain, where the batch fell) is not used."""
    speed = SpeedLearner(prior_s=1e-9)
    cost = _BatchCost()
    for t in range(11):  # 20 running from t = 0 to 10: a step is 20 ms
        speed.observe_report(cost, KEY, SchedulerStats(time=float(t), num_steps=50 * t,
                                                       num_running=20, num_tokens=8000,
                                                       max_num_seqs=32))
    speed.observe_decode_span(cost, KEY, 100, [1.0 + 0.02 * i for i in range(401)])
    assert speed.epsilon(KEY) == pytest.approx(1.0)
    # from t = 9 to 30 the batch fell to 10 (10 ms steps) with no report after t = 10
    speed.observe_decode_span(cost, KEY, 100, [9.0 + 0.01 * i for i in range(2101)])
    assert speed.epsilon(KEY) == pytest.approx(1.0)


def test_the_batch_record_for_epsilon_stays_bounded_on_a_long_run() -> None:
    """The router drops each instance's batch record before the earliest first token of
    its unfinished requests: on a long-running server it stays bounded, and a span of
    an unfinished request still reads the same batch."""
    from tests.cluster.qlm.test_pull_balance import _slot

    router = QLMRouter(plan=False)
    running = request_with_tokens("run", [50.0, 51.0])  # unfinished on instance 0 from 50 s
    for k in range(400):
        slot = _slot(0, running=4)
        slot.load = dataclasses.replace(slot.load, stats=dataclasses.replace(
            slot.load.stats, time=float(k), num_steps=10 * k))
        router.dispatch([request_with_tokens(f"r{k}", [])], [slot])
        if k == 40:
            router._placed["run"], router._requests["run"] = 0, running
        if k == 60:
            before = router.speed.batch_between("0", 50.0, 55.0)
    times = router.speed._batch_times["0"]
    assert before == pytest.approx(4.0) and times[0] == 50.0 and len(times) == 350
    assert router.speed.batch_between("0", 50.0, 55.0) == before
    del router._placed["run"]  # it finished: the record goes up to now
    router.dispatch([request_with_tokens("last", [])], [slot])
    assert len(router.speed._batch_times["0"]) <= 2


def request_with_tokens(rid: str, token_times: list[float]) -> Request:
    from tests.cluster.fakes import request

    req = request(rid, prompt=100)
    req.timeline.token_times.extend(token_times)
    return req
