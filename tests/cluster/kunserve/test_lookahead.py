"""Lookahead microbatch formation: eq. (1) costs, Figure 11's balanced split, bubbles."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from andante.cluster.kunserve.lookahead import (
    ChunkCostModel,
    WorkItem,
    balanced_token_budget,
    bubble_ratio,
    form_microbatches,
    group_config,
    microbatch_cost,
    slot_config,
    split_half,
)
from andante.core import Request, SamplingParams
from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch
from andante.exec.microbatch import Piece, completion_rows, free_slots

MODEL = ChunkCostModel(alpha=1e-6, beta=1e-4, gamma=1e-3)


def eq1_cost_with_prefill(decode_prefixes: list[int], model: ChunkCostModel
                          ) -> Callable[[int], float]:
    """Eq. (1)'s cost of a microbatch of decodes (one token after each of
    `decode_prefixes`) plus a new prompt's first t tokens, as a function of t."""
    decodes = model.gamma + sum(model.chunk(p, 1) for p in decode_prefixes)
    return lambda tokens: decodes + model.chunk(0, tokens)


def test_eq1_counts_prefix_and_self_attention() -> None:
    assert MODEL.chunk(0, 2) == 1e-6 * 3 + 2e-4
    assert MODEL.chunk(10, 2) > MODEL.chunk(0, 2)  # a later chunk costs more


def test_split_halves_the_cost_and_cuts_a_prefill() -> None:
    items = [WorkItem("long", 0, 4000)]
    first, second = split_half(items, MODEL)
    assert first[0].tokens + second[0].tokens == 4000 and second[0].prefix == first[0].tokens
    a, b = microbatch_cost(first, MODEL), microbatch_cost(second, MODEL)
    assert abs(a - b) / (a + b) < 0.01
    assert first[0].tokens > 2000  # the later chunk attends to the earlier: fewer tokens


def test_decode_tokens_are_not_split() -> None:
    items = [WorkItem(f"d{i}", 500, 1, splittable=False) for i in range(7)]
    batches = form_microbatches(items, MODEL, 2)
    assert sorted(len(b) for b in batches) == [3, 4]


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 2000)), min_size=1,
                max_size=20), st.integers(1, 8))
def test_formation_keeps_every_token(chunks: list[tuple[int, int]], stages: int) -> None:
    items = [WorkItem(f"r{i}", p, c) for i, (p, c) in enumerate(chunks)]
    batches = form_microbatches(items, MODEL, stages, min_tokens=1)
    for i, (_, c) in enumerate(chunks):
        assert sum(x.tokens for b in batches for x in b if x.request_id == f"r{i}") == c
    assert len(batches) <= max(stages, 1) * 2


def test_balanced_microbatches_have_fewer_bubbles() -> None:
    assert bubble_ratio([1.0, 1.0], 2) < 0.15  # only the fill and drain
    assert bubble_ratio([1.8, 0.2], 2) > 0.3  # Figure 8's imbalance
    items = [WorkItem("p", 0, 3000)] + [WorkItem(f"d{i}", 800, 1, False) for i in range(20)]
    greedy = [microbatch_cost(items[:1], MODEL), microbatch_cost(items[1:], MODEL)]
    balanced = [microbatch_cost(b, MODEL) for b in form_microbatches(items, MODEL, 2)]
    assert bubble_ratio(balanced, 2) < bubble_ratio(greedy, 2)


def test_a_step_fills_the_free_slots_with_one_instances_budgets_each() -> None:
    base = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256)
    assert [free_slots(3, j) for j in range(4)] == [3, 2, 1, 1]
    empty = slot_config(base, 3, 0)  # an empty pipeline: the whole cycle
    assert (empty.max_num_batched_tokens, empty.max_num_seqs) == (3 * 2048, 3 * 256)
    one = slot_config(base, 3, 2)
    assert (one.max_num_batched_tokens, one.max_num_seqs) == (2048, 256)


def test_a_groups_sequence_budget_follows_its_kv_not_its_tokens() -> None:
    base = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256)
    scaled = slot_config(base, 2, 0, seq_scale=1.29)  # dropped weights: 29% more KV
    assert (scaled.max_num_batched_tokens, scaled.max_num_seqs) == (2 * 2048, 661)
    assert slot_config(base, 2, 1, seq_scale=1.29).max_num_seqs == 331
    assert group_config(base, 2).max_num_seqs == 512  # the default: vLLM PP's budget
    with pytest.raises(ValueError, match="seq_scale"):
        group_config(base, 2, seq_scale=0.0)


def test_rows_complete_with_their_last_piece_and_inner_chunks_need_no_token() -> None:
    batch = StepBatch()
    params = SamplingParams(max_tokens=4)
    batch.add(Request("long", list(range(1, 801)), params, 0.0), 500, 0, False, [0])
    batch.add(Request("end", list(range(1, 101)), params, 0.0), 100, 0, True, [1])
    batch.add(Request("dec", list(range(1, 41)), params, 0.0), 1, 39, True, [2])
    plan = [[Piece(0, 0, 300), Piece(2, 39, 1)], [Piece(0, 300, 200), Piece(1, 0, 100)]]
    done = completion_rows(batch, plan)
    assert (done[0].sampling, done[0].ordered) == ((2,), ())
    assert (done[1].sampling, done[1].ordered) == ((1,), (0,))


def test_a_microbatch_formed_beside_others_fills_to_their_cost() -> None:
    decodes = [800] * 20  # the returning microbatch's decodes, one token each
    cost = eq1_cost_with_prefill(decodes, MODEL)
    alone = cost(0)
    target = 3 * alone  # the microbatch in flight beside it costs three times as much
    budget = balanced_token_budget(cost, len(decodes), target, cap=4096, min_tokens=16)
    assert cost(budget - 20) <= target < cost(budget - 19)  # the most that fits
    assert cost(budget - 20) == pytest.approx(target, rel=0.01)
    assert balanced_token_budget(cost, 20, target, cap=100) == 100  # the slot's cap
    # decodes already dearer than the target: they all go, with min_tokens of prefill
    assert balanced_token_budget(cost, 20, alone / 2, cap=4096, min_tokens=16) == 36
