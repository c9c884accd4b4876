"""The thread count of each step size, kept right while the CPU the engine gets changes.

Design note. The start-up probe (andante.exec.torch_threads) picks, per step size, one
thread or all of them for the machine as it was then. A neighbour that arrives later
changes the answer: with one of two cores taken, a step on two OpenMP threads waits at
every one of its ~150 parallel regions for the thread that is not running, and runs
6-10x slower (issue 32), while one thread keeps its pace; when the neighbour leaves, all
threads win again. Re-running the synthetic probe while serving is not an option (its
steps write K/V into blocks that live requests now own), so the adapter probes on the
served steps themselves, per step-size class (`adaptive_class`: decode sizes one by one,
prefill sizes by power-of-two class):

- It keeps a window of the last WINDOW step times at the current choice and the
  reference median of the last decision. When the window's median drifts from the
  reference by more than DRIFT (slower or faster), or after `reexplore_steps` steps of
  that size (doubling up to MAX_REEXPLORE while the choice holds; a neighbour that
  leaves does not slow a one-thread step, so only a periodic look finds it gone), it
  re-probes: the next steps of that size alternate one thread and all threads,
  TRIALS each after one discarded warm-up step per count (oneDNN builds primitives per
  thread count), and the faster median wins.
- A jump is handled at once, not after a window: when JUMP_STEPS steps in a row at
  more than one thread each take more than JUMP times the reference (a neighbour took a
  core: every barrier now waits for a descheduled thread), the size drops to one thread
  without a probe, and looks again after RECHECK_STEPS steps (doubling while one thread
  keeps winning), so a neighbour that leaves gives the threads back within seconds.
  During a probe, an all-thread trial that takes more than JUMP times the one-thread
  trials' median ends it there (one thread wins): a look beside a neighbour costs two
  slow steps, not four.
- Time comes in as measured step durations; the adapter reads no clock, so tests drive
  it with injected durations.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

#: Step sizes up to this many rows adapt one by one (decode batches: few sizes, many steps
#: each); larger ones by power-of-two class (prefills: many sizes, few steps each), their
#: times scaled to the class's size (a prefill's time grows about linearly with its rows).
EXACT_CLASSES = 64
WINDOW = 16
DRIFT = 1.5
TRIALS = 3
REEXPLORE_STEPS = 256
MAX_REEXPLORE = 8192
#: A jump: JUMP_STEPS steps in a row slower than JUMP x the reference (see the note).
JUMP = 2.0
JUMP_STEPS = 3
RECHECK_STEPS = 64


def adaptive_class(size: int) -> int:
    """The class a step of `size` rows adapts with: itself up to EXACT_CLASSES, else the
    next power of two."""
    return size if size <= EXACT_CLASSES else 1 << (size - 1).bit_length()


def class_range(size_class: int) -> str:
    """`size_class`'s step sizes, for the log."""
    if size_class <= EXACT_CLASSES:
        return str(size_class)
    return f"{max(EXACT_CLASSES, size_class // 2) + 1}-{size_class}"


@dataclass(slots=True)
class _SizeState:
    threads: int
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    reference: float | None = None
    schedule: list[int] = field(default_factory=list)  # thread counts still to try
    trials: dict[int, list[float]] = field(default_factory=dict)
    num_steps: int = 0  # steps at this choice since it was decided
    probe_reason: str = ""  # why the running re-probe started: "drift" or "periodic"
    reexplore_after: int = REEXPLORE_STEPS
    num_jumped: int = 0  # consecutive steps slower than JUMP x the reference


@dataclass(slots=True)
class Decision:
    """A re-probe's outcome, for the log and the tests."""

    size: int
    threads: int
    medians: dict[int, float]
    reason: str


class ThreadAdapter:
    """Thread counts per step-size class; `threads_for` before a step, `observe` after."""

    def __init__(self, num_threads: int, initial: Callable[[int], int],
                 reexplore_steps: int = REEXPLORE_STEPS) -> None:
        self.num_threads = num_threads
        self._initial = initial
        self._reexplore_steps = reexplore_steps
        self._states: dict[int, _SizeState] = {}
        self.decisions: list[Decision] = []

    @property
    def active(self) -> bool:
        return self.num_threads > 1

    def threads_for(self, size: int) -> int:
        """The thread count the next step of class `size` runs at."""
        state = self._state(size)
        return state.schedule[0] if state.schedule else state.threads

    def observe(self, size: int, threads: int, seconds: float) -> Decision | None:
        """A step of class `size` took `seconds` at `threads`; the decision it
        completed, if any."""
        if not self.active:
            return None
        state = self._state(size)
        if state.schedule:
            return self._trial(size, state, threads, seconds)
        if threads != state.threads:
            return None
        state.recent.append(seconds)
        state.num_steps += 1
        if self._jumped(state, seconds):
            return self._drop(size, state, seconds)
        if len(state.recent) < WINDOW:
            return None
        median = statistics.median(state.recent)
        if state.reference is None:
            state.reference = median
            return None
        drifted = median > state.reference * DRIFT or median < state.reference / DRIFT
        if drifted or state.num_steps >= state.reexplore_after:
            self._start_probe(state, "drift" if drifted else "periodic")
        return None

    def _jumped(self, state: _SizeState, seconds: float) -> bool:
        """JUMP_STEPS steps in a row at more than one thread, each JUMP x the reference."""
        if state.threads == 1 or state.reference is None:
            return False
        state.num_jumped = state.num_jumped + 1 if seconds > JUMP * state.reference else 0
        return state.num_jumped >= JUMP_STEPS

    def _drop(self, size: int, state: _SizeState, seconds: float) -> Decision:
        """One thread at once, after a jump; a look again after RECHECK_STEPS."""
        medians = {state.threads: statistics.median(list(state.recent)[-JUMP_STEPS:])}
        state.threads = 1
        state.reference = None
        state.recent.clear()
        state.num_steps = state.num_jumped = 0
        state.reexplore_after = min(RECHECK_STEPS, self._reexplore_steps)
        decision = Decision(size, 1, medians, "jump")
        self.decisions.append(decision)
        return decision

    def _state(self, size: int) -> _SizeState:
        state = self._states.get(size)
        if state is None:
            state = self._states[size] = _SizeState(
                self._initial(size), reexplore_after=self._reexplore_steps)
        return state

    def _start_probe(self, state: _SizeState, reason: str) -> None:
        counts = (1, self.num_threads)
        state.schedule = list(counts) + [c for _ in range(TRIALS) for c in counts]
        state.trials = {c: [] for c in counts}
        state.probe_reason = reason

    def _trial(self, size: int, state: _SizeState, threads: int,
               seconds: float) -> Decision | None:
        if threads != state.schedule[0]:
            return None  # a step that ran at another count (the warm-up, a calibration)
        state.schedule.pop(0)
        if len(state.schedule) < 2 * TRIALS:  # the first step at each count: a warm-up
            state.trials[threads].append(seconds)
        if state.schedule and not self._all_threads_lost(state, threads, seconds):
            return None
        return self._decide(size, state)

    @staticmethod
    def _all_threads_lost(state: _SizeState, threads: int, seconds: float) -> bool:
        """An all-thread trial JUMP x slower than the one-thread trials: stop probing."""
        ones = state.trials[1]
        return threads > 1 and bool(ones) and seconds > JUMP * statistics.median(ones)

    def _decide(self, size: int, state: _SizeState) -> Decision:
        drift = state.probe_reason == "drift"
        medians = {c: statistics.median(t) for c, t in state.trials.items() if t}
        best = min(medians, key=lambda c: (medians[c], c))
        state.schedule.clear()
        changed = best != state.threads
        state.threads = best
        state.reference = medians[best]
        state.recent.clear()
        state.num_steps = state.num_jumped = 0
        if best == 1 and self._initial(size) > 1:  # a neighbour still there: look soon
            state.reexplore_after = (min(RECHECK_STEPS, self._reexplore_steps) if changed
                                     else min(2 * state.reexplore_after, MAX_REEXPLORE))
        elif changed or drift:
            state.reexplore_after = self._reexplore_steps
        else:
            state.reexplore_after = min(2 * state.reexplore_after, MAX_REEXPLORE)
        decision = Decision(size, best, medians, state.probe_reason)
        self.decisions.append(decision)
        return decision
