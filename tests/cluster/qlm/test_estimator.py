import dataclasses

import numpy as np
import pytest

from andante.cluster.qlm.estimator import (
    CostModelTable,
    OutputLengthModel,
    RCTEstimator,
    r_squared,
    waiting_time,
)
from andante.cluster.qlm.groups import form_groups
from andante.cluster.qlm.types import QueuedRequest
from andante.perf import catalog
from andante.perf.cost_model import CostModel
from tests.cluster.qlm.helpers import GB, FlatCost, request, view


def exact_outputs(mean: float = 100.0) -> OutputLengthModel:
    return OutputLengthModel(prior_mean=mean, prior_std=0.0)


def estimator(outputs: OutputLengthModel | None = None) -> RCTEstimator:
    return RCTEstimator(FlatCost(prefill_s=0.5, step_s=0.01), outputs or exact_outputs(),
                        model_bytes={"m1": 2 * GB, "m2": 1 * GB, "m3": 4 * GB})


def test_waiting_time_is_tokens_ahead_over_throughput():
    assert waiting_time([100, 200, 300], throughput=50.0) == pytest.approx(12.0)
    assert waiting_time([], throughput=50.0) == 0.0
    with pytest.raises(ValueError, match="-5"):
        waiting_time([-5], throughput=1.0)


def test_queue_completion_times_on_a_hand_computed_queue():
    # Θ = 100 tok/s, every request outputs exactly 100 tokens, prefill 0.5 s, step 10 ms.
    a = form_groups([request("a1", model="m1"), request("a2", model="m1")], 8)[0]
    b = form_groups([request("b1", model="m2")], 8)[0]
    est = estimator()
    v = view(on_device=("m1",), on_host=("m2",), busy_s=2.0)
    q = est.queue_times(v, [a, b], num_samples=3, rng=np.random.default_rng(0))
    # Group a: W = 0 and 1 s (100 tokens ahead / 100 tok/s), + P 0.5 + D 1.0 -> C = 2.5;
    # it holds the instance for 200 / 100 = 2 s; the instance is busy 2 s first.
    assert q.samples[0] == pytest.approx([4.5] * 3)
    # Group b waits 2 + 2 s, loads m2 from host (1 GB / 10 GB/s) and runs 1.5 s.
    assert q.mean[1] == pytest.approx(2.0 + 2.0 + 0.1 + 1.5)
    assert q.group_ids == (a.group_id, b.group_id)
    # Eq. 2 per request, from now: a1 starts after the busy 2 s, a2 1 s later; b1 after
    # group a's 2 s and the 0.1 s model load.
    assert q.waits == pytest.approx({"a1": 2.0, "a2": 3.0, "b1": 4.1})


def test_swap_time_is_included_only_when_the_model_is_off_device():
    group = form_groups([request("x", model="m3")], 8)[0]
    est = estimator()
    rng = np.random.default_rng(0)
    on_device = est.queue_times(view(on_device=("m3",)), [group], 1, rng).mean[0]
    warm = est.queue_times(view(on_device=("m1",), on_host=("m3",)), [group], 1, rng).mean[0]
    cold = est.queue_times(view(on_device=("m1",)), [group], 1, rng).mean[0]
    assert warm - on_device == pytest.approx(4 * GB / (10 * GB))  # host -> device
    assert cold - on_device == pytest.approx(4 * GB / (10 * GB) + 4 * GB / (1 * GB))


def test_output_length_fit_starts_at_the_prior_and_converges_online():
    model = OutputLengthModel(prior_mean=256.0, prior_std=128.0, prior_weight=8.0)
    assert model.distribution("k") == (256.0, 128.0)
    rng = np.random.default_rng(1)
    for value in rng.normal(600.0, 40.0, size=3000):
        model.observe("k", int(round(value)))
    mean, std = model.distribution("k")
    assert mean == pytest.approx(600.0, abs=5.0)
    assert std == pytest.approx(40.0, abs=5.0)
    assert model.distribution("other") == (256.0, 128.0)
    samples = model.sample("k", (4000,), rng, cap=620)
    assert samples.max() <= 620 and samples.min() >= 1


def test_group_completion_is_the_max_over_members_and_drain_the_sum():
    est = estimator(OutputLengthModel(prior_mean=200.0, prior_std=50.0))
    group = form_groups([request(f"r{k}") for k in range(6)], 8)[0]
    times = est.group_times(view(), group, 500, np.random.default_rng(2))
    assert times.drain.mean() == pytest.approx(6 * 200 / 100.0, rel=0.05)
    assert np.all(times.completion >= times.drain - 1e-9)  # last request waits for the rest


def test_outputs_at_their_caps_are_a_distribution_and_a_cap_is_not_a_length():
    """The estimator knows the output-length distribution only (§6): outputs that ran to
    their own max_tokens (in the simulator every output does: spec.py sets
    ignore_eos) are learned as the key's distribution; a request's cap is not taken as
    its length. A cap bounds the draws only below every cap the key has seen."""
    outputs = OutputLengthModel(prior_mean=500.0, prior_std=100.0, prior_weight=1.0)
    est = estimator(outputs)
    key = form_groups([request("a")], 8, cluster=False)[0].key

    def draws(cap: int) -> np.ndarray:
        capped = QueuedRequest("c", "m1", "interactive", 0.0, 30.0, 100,
                               max_output_tokens=cap)
        group = form_groups([request("a"), capped], 8, cluster=False)[0]  # one group
        return est.sample_outputs(group, 4000, np.random.default_rng(3))[:, 1]

    assert draws(450).max() == 450  # the prior is of uncapped lengths: the cap applies
    for n in (400, 600, 500, 450, 550):
        outputs.observe(key, n, max_tokens=n)  # each ran to its cap (least cap 400)
    # a request's cap is not its length: a cap of 900 leaves the learned distribution
    assert outputs.expected(key, 900) == outputs.mean(key) < 600
    assert (draws(900) == 900).mean() == 0.0
    assert draws(900).mean() == pytest.approx(outputs.mean(key), rel=0.03)
    # the moments already describe outputs capped at 400..600: a cap of 450 must not
    # bias them down again ...
    assert draws(450).mean() == pytest.approx(outputs.mean(key), rel=0.03)
    assert draws(450).max() > 450
    # ... but a cap below every cap seen bounds the request (a running one too)
    assert draws(40).max() == 40
    assert outputs.expected(key, 40) == 40 and outputs.expected(key, 450) == outputs.mean(key)
    assert outputs.caps(key, 399) and not outputs.caps(key, 400) and not outputs.caps(key, None)


def test_each_request_gets_its_own_completion_and_the_group_the_latest():
    """Eq. 1 per request (its own wait and decode) beside eq. 5 per group (the max)."""
    est = estimator(exact_outputs(100.0))
    group = form_groups([request(f"r{k}") for k in range(3)], 8)[0]
    q = est.queue_times(view(), [group], 1, np.random.default_rng(0))
    # Θ = 100 tok/s: r0 waits 0 s, r1 1 s, r2 2 s; each 0.5 s prefill + 100 x 0.01 s
    assert [q.completions[f"r{k}"] for k in range(3)] == pytest.approx([1.5, 2.5, 3.5])
    assert q.mean[0] == pytest.approx(3.5)


def test_cost_model_table_adapts_the_perf_cost_model():
    cm = CostModel(catalog.get_model("mistral-7b"), catalog.get_hardware("a100-80g"))
    table = CostModelTable({("i0", "mistral"): cm})
    assert table.prefill_time("i0", "mistral", 512) == cm.prefill_time(512)
    assert table.decode_time("i0", "mistral", 8, 1024) == cm.decode_time(8, 1024)
    with pytest.raises(ValueError, match="'other'"):
        table.prefill_time("i0", "other", 1)


def test_throughput_falls_back_to_the_cost_model():
    est = estimator()
    v = view(models=())  # no measured Θ
    assert est.throughput(v, "m1") == pytest.approx(8 / 0.01)


def test_r_squared():
    obs = np.array([1.0, 2.0, 3.0, 4.0])
    assert r_squared(obs, obs) == 1.0
    assert r_squared(np.full(4, obs.mean()), obs) == pytest.approx(0.0)
    assert r_squared(obs + 0.1, obs) < 1.0
    with pytest.raises(ValueError):
        r_squared([1.0], [1.0])
    with pytest.raises(ValueError, match="equal"):
        r_squared([1.0, 2.0], [3.0, 3.0])


def test_requests_that_take_free_batch_slots_start_at_once_and_hold_no_one_back():
    # Θ = 100 tok/s, 100 output tokens each, prefill 0.5 s, step 10 ms; 2 free slots.
    group = form_groups([request(f"r{k}") for k in range(4)], 8)[0]
    v = dataclasses.replace(view(busy_s=2.0), free_slots=2)
    q = estimator().queue_times(v, [group], num_samples=2, rng=np.random.default_rng(0))
    # r0 and r1 take the slots (r1 after r0's 0.5 s prefill); r2 waits for the busy
    # 2 s, r3 1 s more (eq. 2 over the queue ahead of it: r2's 100 tokens, not the
    # running r0's and r1's)
    assert q.waits == pytest.approx({"r0": 0.0, "r1": 0.5, "r2": 2.0, "r3": 3.0})
    assert q.mean[0] == pytest.approx(3.0 + 0.5 + 1.0)
    # a model to load first: no slot is free for it before the load
    other = form_groups([request("x", model="m2")], 8)[0]
    q = estimator().queue_times(v, [other], num_samples=1, rng=np.random.default_rng(0))
    assert q.waits["x"] == pytest.approx(2.0 + 1 * GB / (10 * GB) + 1 * GB / (1 * GB))


def test_the_queue_waits_for_the_running_batch_to_free_its_first_slot():
    # Θ = 100 tok/s, 100 output tokens each, prefill 0.5 s, step 10 ms; 2 free slots,
    # nothing busy: r0 finishes first, at 0.5 + 1 s; r2 starts then (eq. 2 alone: now)
    group = form_groups([request(f"r{k}") for k in range(4)], 8)[0]
    v = dataclasses.replace(view(busy_s=0.0), free_slots=2)
    q = estimator().queue_times(v, [group], num_samples=2, rng=np.random.default_rng(0))
    assert q.waits == pytest.approx({"r0": 0.0, "r1": 0.5, "r2": 1.5, "r3": 2.5})
    # a request already running frees a slot at 0.2 s: r2 then waits only for the
    # admissions ahead of it (r0's and r1's prefills: 1 s)
    sooner = dataclasses.replace(v, first_finish_s=0.2)
    q = estimator().queue_times(sooner, [group], num_samples=2, rng=np.random.default_rng(0))
    assert q.waits["r2"] == pytest.approx(1.0)
    # no free slot: the queue starts when the running batch frees one
    full = dataclasses.replace(v, free_slots=0, first_finish_s=4.0)
    q = estimator().queue_times(full, [group], num_samples=2, rng=np.random.default_rng(0))
    assert q.waits == pytest.approx({"r0": 4.0, "r1": 5.0, "r2": 6.0, "r3": 7.0})
    with pytest.raises(ValueError, match="first_finish_s"):
        dataclasses.replace(v, first_finish_s=-1.0)
