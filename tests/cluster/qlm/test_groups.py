import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.qlm.groups import GroupKey, GroupTable, form_groups, length_bucket
from andante.cluster.qlm.types import QueuedRequest
from tests.cluster.qlm.helpers import request


def test_groups_split_by_model_slo_class_and_prompt_length():
    reqs = [request(f"r{k}", model=m, slo_class=c, prompt=p, arrival=k)
            for k, (m, c, p) in enumerate((m, c, p) for m in ("a", "b")
                                          for c in ("interactive", "batch")
                                          for p in (100, 2000))]
    groups = form_groups(reqs, avg_batch_size=8)
    assert len(groups) == 8
    keys = {g.key for g in groups}
    assert GroupKey("a", "batch", length_bucket(2000)) in keys
    assert all(g.num_requests == 1 for g in groups)
    assert length_bucket(100) != length_bucket(2000)


def test_group_larger_than_delta_times_batch_is_split_fcfs():
    reqs = [request(f"r{k:02d}", arrival=float(k), slo=100.0 - k) for k in range(50)]
    groups = form_groups(reqs, avg_batch_size=4, delta=4.0)  # cap = 16
    assert [g.num_requests for g in groups] == [13, 13, 12, 12]
    assert [rid for g in groups for rid in g.request_ids] == [r.request_id for r in reqs]
    assert groups[0].deadline == min(r.deadline for r in reqs[:13])
    assert groups[1].num_prompt_tokens == 13 * 100


def test_group_at_the_cap_is_not_split():
    reqs = [request(f"r{k}", arrival=float(k)) for k in range(16)]
    assert len(form_groups(reqs, avg_batch_size=4, delta=4.0)) == 1


def test_incremental_add_and_remove_match_a_fresh_grouping():
    reqs = [request(f"r{k}", model="ab"[k % 2], prompt=50 + 300 * (k % 5), arrival=float(k))
            for k in range(40)]
    table = GroupTable()
    for r in reqs:
        table.add(r)
    gone = {f"r{k}" for k in range(0, 40, 3)}
    table.remove(gone | {"unknown"})
    remaining = [r for r in reqs if r.request_id not in gone]
    assert len(table) == len(remaining)
    assert table.snapshot(4) == form_groups(remaining, avg_batch_size=4)


def test_expected_output_uses_the_per_key_mean():
    groups = form_groups([request("a"), request("b")], 8, mean_output_tokens=lambda key: 150.0)
    assert groups[0].expected_output_tokens == 300.0


def test_validation():
    table = GroupTable()
    table.add(request("a"))
    with pytest.raises(ValueError, match="'a'"):
        table.add(request("a"))
    with pytest.raises(ValueError, match="increasing"):
        GroupTable(length_edges=(100, 50))
    with pytest.raises(ValueError, match="-1"):
        table.snapshot(avg_batch_size=-1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xyz"), st.sampled_from(["i", "b"]),
                          st.integers(1, 40_000), st.floats(0, 100)), max_size=120),
       st.integers(1, 16), st.sampled_from([1.0, 2.0, 4.0]))
def test_every_request_in_exactly_one_group_within_the_cap(specs, batch, delta):
    reqs = [request(f"r{k}", model=m, slo_class=c, prompt=p, arrival=a)
            for k, (m, c, p, a) in enumerate(specs)]
    groups = form_groups(reqs, avg_batch_size=batch, delta=delta)
    cap = math.ceil(delta * batch)
    ids = [rid for g in groups for rid in g.request_ids]
    assert sorted(ids) == sorted(r.request_id for r in reqs)
    by_id = {r.request_id: r for r in reqs}
    for g in groups:
        assert 1 <= g.num_requests <= cap
        members = [by_id[rid] for rid in g.request_ids]
        assert {(r.model, r.slo_class) for r in members} == {(g.model, g.slo_class)}
        assert g.deadline == min(r.deadline for r in members)
        assert [r.arrival for r in members] == sorted(r.arrival for r in members)
    bucketed = form_groups(reqs, avg_batch_size=batch, delta=delta, cluster=False)
    sizes: dict[GroupKey, int] = {}
    for g in bucketed:
        sizes[g.key] = sizes.get(g.key, 0) + g.num_requests
    for key, n in sizes.items():
        assert sum(1 for g in bucketed if g.key == key) == math.ceil(n / cap)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40_000), st.integers(1, 4000)), min_size=1,
                max_size=60))
def test_clusters_span_at_most_a_factor_of_four_in_input_and_output(lengths):
    """Algorithm 1's k-means: each group's members lie within a factor of 4 of each other
    in prompt and in max_tokens (the expected output with no learned mean)."""
    reqs = [QueuedRequest(f"r{k}", "m", "b", float(k), 1e6, p, o)
            for k, (p, o) in enumerate(lengths)]
    groups = form_groups(reqs, avg_batch_size=1000)
    by_id = {r.request_id: r for r in reqs}
    assert sorted(rid for g in groups for rid in g.request_ids) == sorted(by_id)
    if len(groups) < 64:  # k reached its limit otherwise
        for g in groups:
            members = [by_id[rid] for rid in g.request_ids]
            for attr in ("num_prompt_tokens", "max_output_tokens"):
                values = [getattr(r, attr) for r in members]
                assert max(values) <= 4 * min(values) + 1e-9


def test_similar_lengths_share_a_group_across_bucket_edges():
    """Buckets would split 250- and 260-token prompts at the 256 edge; clusters do not,
    and keep a 2,000-token prompt apart."""
    reqs = [QueuedRequest("a", "m", "b", 0.0, 100.0, 250, 100),
            QueuedRequest("b", "m", "b", 1.0, 100.0, 260, 110),
            QueuedRequest("c", "m", "b", 2.0, 100.0, 2000, 100)]
    groups = form_groups(reqs, avg_batch_size=8)
    assert sorted(g.request_ids for g in groups) == [("a", "b"), ("c",)]
    assert len(form_groups(reqs, avg_batch_size=8, cluster=False)) == 3


def test_a_request_leaving_keeps_the_others_groups_until_the_next_arrival():
    """Algorithm 1 groups requests as they arrive: pulling some of them must not move
    the rest between groups (that reordered queues the estimator had just predicted);
    a new arrival clusters again."""
    reqs = [QueuedRequest(f"r{k:02d}", "m", "b", float(k), 100.0, 40 + (k * 97) % 1500,
                          20 + (k * 61) % 700) for k in range(24)]
    table = GroupTable()
    for r in reqs:
        table.add(r)
    before = table.snapshot(2.0, 2.0)
    gone = {g.request_ids[0] for g in before}
    table.remove(gone)
    after = table.snapshot(2.0, 2.0)
    kept = [tuple(r for r in g.request_ids if r not in gone) for g in before]
    assert [g.request_ids for g in after] == [ids for ids in kept if ids]
    remaining = [r for r in reqs if r.request_id not in gone]
    fresh = form_groups(remaining, avg_batch_size=2.0, delta=2.0)
    assert [g.request_ids for g in fresh] != [g.request_ids for g in after]  # it would move
    table.add(QueuedRequest("new", "m", "b", 30.0, 130.0, 700, 300))
    assert table.snapshot(2.0, 2.0) == form_groups([*remaining, table.get("new")],
                                                   avg_batch_size=2.0, delta=2.0)
