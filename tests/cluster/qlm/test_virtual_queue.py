import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.qlm.groups import form_groups
from andante.cluster.qlm.virtual_queue import (
    VirtualQueue,
    choose_preemption,
    head_change_preemptions,
    model_actions,
    pull_requests,
)
from andante.core.request import PreemptionMode
from andante.perf import catalog
from andante.perf.cost_model import CostModel
from tests.cluster.qlm.helpers import GB, request, view


def queue_of(*groups):
    by_id = {g.group_id: g for g in groups}
    return VirtualQueue("i0", tuple(by_id)), by_id


def test_pull_takes_head_group_fcfs_within_spare_capacity():
    head = form_groups([request(f"a{k}", prompt=300, arrival=k) for k in range(3)], 8)[0]
    q, by_id = queue_of(head)
    assert pull_requests(q, by_id, view(capacity=1000, running=200)) == ("a0", "a1")
    assert pull_requests(q, by_id, view(capacity=1000, running=800)) == ()
    assert pull_requests(q, by_id, view(capacity=1000, running=0), reserve_output_tokens=200) \
        == ("a0", "a1")


def test_pull_continues_into_the_next_group_only_without_a_model_swap():
    a = form_groups([request("a0", prompt=100)], 8)[0]
    b = form_groups([request("b0", slo_class="batch", prompt=100)], 8)[0]
    c = form_groups([request("c0", model="m2", prompt=100)], 8)[0]
    q, by_id = queue_of(a, b, c)
    assert pull_requests(q, by_id, view(on_device=("m1",))) == ("a0", "b0")
    assert pull_requests(q.without([a.group_id, b.group_id]), by_id, view(on_device=("m1",))) \
        == ()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(1, 20_000),
       st.integers(0, 20_000))
def test_pulled_requests_are_a_fcfs_prefix_that_fits(prompts, capacity, running):
    reqs = [request(f"r{k:02d}", prompt=p, arrival=float(k)) for k, p in enumerate(prompts)]
    groups = form_groups(reqs, avg_batch_size=1000)
    q, by_id = queue_of(*groups)
    v = view(capacity=capacity, running=running)
    pulled = pull_requests(q, by_id, v)
    order = [rid for g in groups for rid in g.request_ids]
    assert list(pulled) == order[:len(pulled)]
    size = {r.request_id: r.num_prompt_tokens for r in reqs}
    assert sum(size[r] for r in pulled) <= v.spare_tokens
    if len(pulled) < len(order) and len(groups) == 1:
        assert sum(size[r] for r in pulled) + size[order[len(pulled)]] > v.spare_tokens


def test_model_actions_swap_for_the_head_and_warm_start_the_next_cold_model():
    a = form_groups([request("a", model="m2")], 8)[0]
    b = form_groups([request("b", model="m1")], 8)[0]
    c = form_groups([request("c", model="m3")], 8)[0]
    q, by_id = queue_of(a, b, c)
    actions = model_actions(q, by_id, view(on_device=("m1",), on_host=("m2",)))
    assert actions.swap_to == "m2"
    assert actions.warm_start == "m3"
    q2, by_id2 = queue_of(b, a)
    actions = model_actions(q2, by_id2, view(on_device=("m1",), on_host=("m2",)))
    assert (actions.swap_to, actions.warm_start) == (None, None)


def test_warm_start_only_what_fits_in_host_memory():
    a = form_groups([request("a", model="m1")], 8)[0]
    b = form_groups([request("b", model="m3")], 8)[0]
    c = form_groups([request("c", model="m2")], 8)[0]
    q, by_id = queue_of(a, b, c)
    sizes = {"m1": 10 * GB, "m2": 5 * GB, "m3": 30 * GB}
    v = view(on_device=("m1",))
    full = dataclasses.replace(v, host_memory_bytes=20 * GB)
    assert model_actions(q, by_id, v, sizes).warm_start == "m3"  # no host limit known
    assert model_actions(q, by_id, full, sizes).warm_start == "m2"  # m3 does not fit


def test_state_swap_chosen_when_the_link_is_cheaper_than_recompute():
    # Mistral-7B (GQA, 128 KiB of KV per token) on an A100 over PCIe: swapping 2000 tokens
    # takes ~10 ms, re-prefilling them ~190 ms (Insight #2: swap for Mistral-7B).
    cm = CostModel(catalog.get_model("mistral-7b"), catalog.get_hardware("a100-80g"))
    choice = choose_preemption(2000, cm.kv_bytes_per_token, cm.hardware.host_link_bandwidth,
                               cm.prefill_time)
    assert choice.mode is PreemptionMode.SWAP
    assert choice.swap_cost_s < choice.recompute_cost_s


def test_eviction_chosen_when_kv_is_large_and_the_link_slow():
    # OPT-13B (MHA, 800 KiB of KV per token, like Vicuna-13B) on an A10 behind a 1 GB/s
    # link: swapping 2000 tokens takes ~1.6 s, recomputing them ~0.85 s.
    cm = CostModel(catalog.get_model("opt-13b"), catalog.get_hardware("a10-24g"))
    choice = choose_preemption(2000, cm.kv_bytes_per_token, 1 * GB, cm.prefill_time)
    assert choice.mode is PreemptionMode.RECOMPUTE
    assert choice.recompute_cost_s < choice.swap_cost_s


def test_eviction_chosen_when_host_memory_is_short():
    cheap = choose_preemption(1000, 1000.0, 10 * GB, lambda n: 1.0, host_free_bytes=10**5)
    assert cheap.mode is PreemptionMode.RECOMPUTE
    choices = head_change_preemptions({"a": 1000, "b": 1000}, 1000.0, 10 * GB,
                                      lambda n: 1.0, host_free_bytes=1.5e6)
    assert [c.mode for c in choices.values()] == [PreemptionMode.SWAP, PreemptionMode.RECOMPUTE]


def test_validation():
    with pytest.raises(ValueError, match="duplicate"):
        VirtualQueue("i0", ("g", "g"))
    with pytest.raises(ValueError, match="-1"):
        choose_preemption(-1, 1.0, 1.0, lambda n: 1.0)
