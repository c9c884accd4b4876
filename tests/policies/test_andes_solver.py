"""`knapsack.py` and `refiner.py`: the knapsack solvers (Alg. 1, Appendix C), §4.2's
batch-size pruning and the overhead-aware refiner's pairing and acceptance (§4.3), in
isolation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from andante.policies.andes.knapsack import (
    batch_candidates,
    batch_range,
    dp_pack,
    fill,
    greedy_pack,
    top_order,
)
from andante.policies.andes.refiner import MAX_EXACT, Pair, accepted_prefix, pair_up


def _brute(gain: np.ndarray, weight: np.ndarray, capacity: float, batch: int) -> float:
    best = 0.0
    for r in range(batch + 1):
        for combo in itertools.combinations(range(len(gain)), r):
            if weight[list(combo)].sum() <= capacity:
                best = max(best, float(gain[list(combo)].sum()))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_greedy_equals_dp_when_sizes_are_equal(seed: int) -> None:
    """With equal sizes, gain per block orders by gain: the greedy is optimal."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    gain = rng.uniform(0, 1, n)
    weight = np.full(n, float(rng.integers(1, 6)))
    capacity = float(rng.integers(0, 60))
    batch = int(rng.integers(1, n + 1))
    prio = gain / weight
    greedy = greedy_pack(prio, gain, weight, capacity, batch)
    exact = dp_pack(prio, gain, weight, capacity, batch)
    assert greedy.value == pytest.approx(exact.value)
    assert len(greedy.chosen) <= batch and weight[greedy.chosen].sum() <= capacity


@pytest.mark.parametrize("seed", range(30))
def test_dp_is_exact_on_small_instances(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 9))
    gain = rng.uniform(0, 1, n)
    weight = rng.integers(1, 10, n).astype(float)
    capacity = float(rng.integers(0, 30))
    batch = int(rng.integers(1, n + 1))
    packing = dp_pack(gain / weight, gain, weight, capacity, batch)
    assert packing.value == pytest.approx(_brute(gain, weight, capacity, batch))
    assert weight[packing.chosen].sum() <= capacity and len(packing.chosen) <= batch
    assert packing.value == pytest.approx(gain[packing.chosen].sum())
    greedy = greedy_pack(gain / weight, gain, weight, capacity, batch)
    assert greedy.value <= packing.value + 1e-12


def test_greedy_stops_at_the_first_request_that_does_not_fit() -> None:
    gain = np.array([0.9, 0.8, 0.1])
    weight = np.array([1.0, 10.0, 1.0])
    packing = greedy_pack(np.array([3.0, 2.0, 1.0]), gain, weight, 5.0, 3)
    assert packing.chosen.tolist() == [0]  # Algorithm 1 breaks at request 1


def test_fill_adds_zero_gain_items_that_fit() -> None:
    gain = np.array([1.0, 0.0, 0.0])
    weight = np.array([2.0, 2.0, 5.0])
    prio = np.array([0.5, 0.0, 0.0])
    packing = fill(dp_pack(prio, gain, weight, 4.0, 3), prio, weight, 4.0)
    assert sorted(packing.chosen.tolist()) == [0, 1] and packing.value == 1.0


def test_batch_range_prunes_to_what_memory_and_speed_allow() -> None:
    weight = np.array([5.0, 1.0, 3.0, 2.0, 8.0])
    # shortest contexts first: 1 + 2 + 3 = 6 <= 7 < 11
    assert batch_range(weight, 7.0, 256, fast_batch=256) == (3, 3)
    assert batch_range(weight, 7.0, 2, fast_batch=256) == (2, 2)  # max_num_seqs
    assert batch_range(weight, 100.0, 256, fast_batch=2) == (2, 5)
    assert batch_candidates(2, 5, 16).tolist() == [2, 3, 4, 5]
    spread = batch_candidates(1, 200, 5)
    assert spread[0] == 1 and spread[-1] == 200 and len(spread) == 5


def test_top_order() -> None:
    prio = np.array([0.5, 1.0, 0.5, 1.0, 0.2])
    top = top_order(prio, 3).tolist()
    assert top[:2] == [1, 3] and top[2] in (0, 2)
    assert top_order(prio, 10).tolist() == [1, 3, 0, 2, 4]  # all: stable


# ---- the refiner (§4.3) ------------------------------------------------------------
def test_pair_up_takes_the_fewest_lowest_priority_victims() -> None:
    pairs = pair_up([4, 3, 10], [2, 3, 1], free_blocks=3)
    assert [(p.admit, p.victims) for p in pairs] == [(0, [0]), (1, [1])]
    # the third admission cannot fit even with the last victim: pairing stops
    assert pair_up([2, 2], [], free_blocks=5)[1].victims == []


def _linear_loss(rate: float):  # type: ignore[no-untyped-def]
    return lambda stall: rate * stall


def test_keeps_pairs_while_gain_beats_the_stall_they_cause() -> None:
    pairs = [Pair(0, [0]), Pair(1, [1]), Pair(2, [2])]
    gain = np.array([0.9, 0.5, 0.05])
    cost = np.array([0.1, 0.1, 0.1])
    victims = np.zeros(3)
    # each pair stalls the kept requests 0.1 s; they lose 1 QoE point per second
    assert accepted_prefix(pairs, gain, cost, victims, victims, _linear_loss(1.0)) == 2
    # an admission that gains less than its overhead costs cancels the rest
    assert accepted_prefix(pairs, gain[::-1].copy(), cost, victims, victims,
                           _linear_loss(1.0)) == 0


def test_victim_gains_count_against_the_admission() -> None:
    pairs = [Pair(0, [0, 1])]
    gain = np.array([0.5])
    assert accepted_prefix(pairs, gain, np.zeros(1), np.array([0.3, 0.3]), np.zeros(2),
                           _linear_loss(0.0)) == 0
    assert accepted_prefix(pairs, gain, np.zeros(1), np.array([0.1, 0.1]), np.zeros(2),
                           _linear_loss(0.0)) == 1


def test_free_admissions_are_kept_but_their_overhead_counts() -> None:
    pairs = [Pair(0), Pair(1, [0])]
    gain = np.array([0.1, 0.3])
    cost = np.array([5.0, 0.1])
    # the free admission's 5 s stall is paid before the pair: loss grows 0.1 * 0.1 only
    assert accepted_prefix(pairs, gain, cost, np.zeros(1), np.zeros(1),
                           _linear_loss(0.1)) == 2
    # but it exhausts a 1 s preemption budget
    assert accepted_prefix(pairs, gain, cost, np.zeros(1), np.zeros(1), _linear_loss(0.1),
                           budget=1.0) == 1


def test_many_pairs_interpolate_a_monotone_loss() -> None:
    n = 3 * MAX_EXACT
    pairs = [Pair(i, [i]) for i in range(n)]
    gain = np.full(n, 0.15)
    cost = np.full(n, 0.1)
    calls: list[int] = []

    def loss(stall: np.ndarray) -> np.ndarray:
        calls.append(len(stall))
        return np.where(stall > 5.0, 2.0 * (stall - 5.0), 0.0)

    kept = accepted_prefix(pairs, gain, cost, np.zeros(n), np.zeros(n), loss)
    assert 45 <= kept <= 55 and max(calls) <= MAX_EXACT
