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


def test_sampled_outputs_follow_the_learned_lengths_not_each_requests_cap():
    outputs = OutputLengthModel(prior_mean=500.0, prior_std=100.0)
    est = estimator(outputs)
    capped = QueuedRequest("c", "m1", "interactive", 0.0, 30.0, 100, max_output_tokens=450)
    group = form_groups([request("a"), capped], 8, cluster=False)[0]  # one group
    outs = est.sample_outputs(group, 4000, np.random.default_rng(3))
    # the learned moments already describe capped outputs: a cap must not bias them down
    assert outs[:, 1].mean() == pytest.approx(500.0, rel=0.02)
    assert outs[:, 1].max() > 450 and outs.max() <= outputs.max_tokens


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
