"""The overhead-aware refiner (§4.3) in isolation."""

from __future__ import annotations

import numpy as np

from andante.policies.andes.solver import MAX_EXACT, Pair, accepted_prefix, pair_up


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
