"""Per-size thread counts that follow the CPU the engine gets (andante.exec.thread_adapter),
driven by injected step durations: no timing, no threads."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from andante.exec.thread_adapter import (
    JUMP_STEPS,
    RECHECK_STEPS,
    TRIALS,
    WINDOW,
    ThreadAdapter,
    adaptive_class,
    class_range,
)


def run(adapter: ThreadAdapter, size: int, cost: Callable[[int], float], steps: int) -> None:
    """`steps` steps of class `size`, each taking cost(threads) seconds."""
    for _ in range(steps):
        threads = adapter.threads_for(size)
        adapter.observe(size, threads, cost(threads))


def quiet(threads: int) -> float:
    return 0.010 if threads == 2 else 0.016  # two threads win


def neighbour(threads: int) -> float:
    return 0.080 if threads == 2 else 0.017  # the second thread is often descheduled


def mild_neighbour(threads: int) -> float:
    return 0.017 if threads == 2 else 0.012  # slower than 1.5x, faster than 2x quiet


def test_the_start_up_rule_holds_while_nothing_changes() -> None:
    adapter = ThreadAdapter(2, lambda size: 1 if size < 8 else 2, reexplore_steps=10_000)
    run(adapter, 16, quiet, 500)
    run(adapter, 4, lambda t: 0.005, 500)
    assert adapter.threads_for(16) == 2 and adapter.threads_for(4) == 1
    assert adapter.decisions == []


def test_a_neighbour_arriving_moves_the_size_to_one_thread_and_back() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    run(adapter, 8, neighbour, 2 * WINDOW + 2 * (TRIALS + 1))
    assert adapter.threads_for(8) == 1
    assert adapter.decisions[-1].reason == "jump"
    # one thread does not slow down when the neighbour leaves: a periodic look finds it
    run(adapter, 8, quiet, 2000)
    assert adapter.threads_for(8) == 2
    assert adapter.decisions[-1].reason == "periodic"


def test_a_re_probe_discards_each_count_s_first_step() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    run(adapter, 8, mild_neighbour, WINDOW)  # drift seen: the re-probe starts
    first = {1: True, 2: True}

    def warm_up_is_slow(threads: int) -> float:  # a huge first step at each count
        slow = first[threads]
        first[threads] = False
        return 10.0 if slow else mild_neighbour(threads)

    run(adapter, 8, warm_up_is_slow, 2 * (TRIALS + 1))
    decision = adapter.decisions[-1]
    assert decision.threads == 1 and decision.reason == "drift"
    assert decision.medians == {1: 0.012, 2: 0.017}


def test_a_jump_drops_to_one_thread_within_a_few_steps() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    run(adapter, 8, neighbour, JUMP_STEPS)
    assert adapter.threads_for(8) == 1
    assert adapter.decisions[-1].reason == "jump"


def test_a_single_slow_step_is_no_jump() -> None:
    adapter = ThreadAdapter(2, lambda size: 2, reexplore_steps=10_000)
    run(adapter, 8, quiet, 2 * WINDOW)
    for _ in range(20):  # a hiccup now and then, too short for a jump or a drift
        run(adapter, 8, neighbour, JUMP_STEPS - 1)
        run(adapter, 8, quiet, 3 * JUMP_STEPS)
    assert adapter.threads_for(8) == 2 and adapter.decisions == []


def test_a_look_beside_the_neighbour_costs_two_slow_steps_and_backs_off() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    slow_steps = []

    def counted(threads: int) -> float:
        slow_steps.append(threads == 2)
        return neighbour(threads)

    run(adapter, 8, counted, 4000)
    looks = [d for d in adapter.decisions if d.reason == "periodic"]
    assert looks and all(d.threads == 1 and len(d.medians) == 2 for d in looks)
    assert sum(slow_steps) <= JUMP_STEPS + 2 * len(looks)
    assert len(looks) <= 8  # RECHECK_STEPS, then twice as far apart each time


def test_the_threads_come_back_soon_after_the_neighbour_leaves() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    run(adapter, 8, neighbour, JUMP_STEPS)
    run(adapter, 8, quiet, WINDOW + RECHECK_STEPS + 2 * (TRIALS + 1))
    assert adapter.threads_for(8) == 2


def test_sizes_adapt_independently() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    run(adapter, 8, quiet, 2 * WINDOW)
    run(adapter, 512, lambda t: 0.2 if t == 2 else 0.35, 2 * WINDOW)
    run(adapter, 8, neighbour, 2 * WINDOW + 2 * (TRIALS + 1))
    assert adapter.threads_for(8) == 1 and adapter.threads_for(512) == 2


def test_steps_at_another_count_are_ignored() -> None:
    adapter = ThreadAdapter(2, lambda size: 2)
    for _ in range(5 * WINDOW):
        adapter.observe(8, 1, 99.0)  # e.g. a warm-up at one thread
    assert adapter.threads_for(8) == 2 and adapter.decisions == []


def test_one_thread_never_adapts() -> None:
    adapter = ThreadAdapter(1, lambda size: 1)
    run(adapter, 8, neighbour, 1000)
    assert adapter.threads_for(8) == 1 and adapter.decisions == []


def test_periodic_looks_back_off_while_the_choice_holds() -> None:
    adapter = ThreadAdapter(2, lambda size: 2, reexplore_steps=64)
    run(adapter, 8, quiet, 64 * 200)
    periodic = [d for d in adapter.decisions if d.reason == "periodic"]
    assert all(d.threads == 2 for d in periodic)
    assert 3 <= len(periodic) <= 10  # 64, 128, 256, ... up to MAX_REEXPLORE apart


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 8, 64]), st.floats(0.001, 1.0)),
                min_size=1, max_size=400))
def test_choices_are_always_one_or_all_threads(steps: list[tuple[int, float]]) -> None:
    adapter = ThreadAdapter(4, lambda size: 1 if size < 8 else 4)
    for size, seconds in steps:
        threads = adapter.threads_for(size)
        assert threads in (1, 4)
        adapter.observe(size, threads, seconds * threads)


def test_small_sizes_adapt_alone_and_large_ones_by_power_of_two() -> None:
    assert [adaptive_class(n) for n in (1, 8, 64)] == [1, 8, 64]
    assert [adaptive_class(n) for n in (65, 128, 129, 300)] == [128, 128, 256, 512]
    assert class_range(8) == "8" and class_range(128) == "65-128"
    assert class_range(512) == "257-512"
