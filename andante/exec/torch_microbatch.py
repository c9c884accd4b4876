"""Pipelined execution of a split model: each stage on its own worker thread, a step's
microbatches in flight across the stages (KunServe §4.3, §5).

Design note. A pipeline group's step is cut into microbatches (`MicrobatchPlanner`: the
caller's decision, e.g. KunServe's lookahead, andante.cluster.kunserve.lookahead; the
default `by_rows` cuts the rows into `num_stages` runs of equal count). A microbatch is
a list of `Piece`s: rows of the step, or a prefill chunk cut in two (its first piece
covers positions [prefix, prefix + tokens), the second the rest; only the piece that
ends the row samples). `StageWorkers` runs one thread per stage, each taking
microbatches from its inbox in order, running its layers, and handing the hidden states
to the next stage's inbox: stage k works on microbatch m while stage k+1 works on
m - 1. Every stage sees the microbatches in the same order, so a chunk's second piece
reads, at every layer, the KV its first piece wrote there: the arithmetic is the
unsplit model's and greedy outputs are token-identical. `StageWorkers.run` returns once the last
microbatch left the last stage (the pipeline drains at each step). `StageStream` keeps
the stage threads running across steps instead: microbatches are fed one by one and it
reports each one leaving stage 0 and the last stage, so the engine can apply each
microbatch's rows as it completes and feed the next step while earlier microbatches are
still in later stages (andante.engine.overlap). The bubble share is the idle share of
the stages over the span the pipeline held work: 1 - Σ busy / (stages x span).
Threads: torch's intra-op count is per OS thread, and a new thread starts at the count
some thread set last (torch 2.13: a stage thread's `set_num_threads` is the default of
every thread started after it), so every thread here and every background thread
(`start_thread`) sets an explicit count; two stage threads each opening an OpenMP team
of every core would run 2 x cores threads on the cores, so each stage thread takes its
share (`stage_threads`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from andante.exec.microbatch import MicrobatchPlanner, Piece, by_rows, check_plan, sub_batch

__all__ = ["MicrobatchPlanner", "Piece", "PipelineTimes", "StageStream", "StageWorkers",
           "by_rows", "check_plan", "stage_threads", "sub_batch"]


StageFn = Callable[[int, Any, Any], Any]  # (stage index, hidden, inputs) -> hidden


@dataclass(slots=True)
class PipelineTimes:
    """Stage-seconds busy and the pipelined steps' span, summed over steps."""

    busy: float = 0.0
    span: float = 0.0
    num_stages: int = 1
    num_microbatches: int = 0
    num_steps: int = 0
    per_stage: list[float] = field(default_factory=list)
    capacity: float = 0.0  # stage-seconds: each step's span times its stage count

    @property
    def bubble_share(self) -> float | None:
        return None if self.capacity <= 0 else max(0.0, 1.0 - self.busy / self.capacity)

    def carry(self, earlier: PipelineTimes) -> None:
        """Count in the steps of `earlier` (the group had other stages then)."""
        self.busy += earlier.busy
        self.span += earlier.span
        self.capacity += earlier.capacity
        self.num_microbatches += earlier.num_microbatches
        self.num_steps += earlier.num_steps


_STOP = object()


def stage_threads(num_threads: int, num_stages: int) -> int:
    """Intra-op threads per stage thread when `num_stages` stages run at once on
    `num_threads` cores (module note): the cores split among them, at least one each."""
    return max(1, num_threads // max(1, num_stages))


def start_thread(name: str, threads: int, target: Callable[..., object],
                 *args: object) -> threading.Thread:
    """Run `target(*args)` on a daemon thread that sets its own intra-op threads to
    `threads` first: a new thread starts at the count some thread set last (torch
    2.13: a stage thread's share, or 1 after a worker's small step), not the
    executor's."""
    def run() -> None:
        torch.set_num_threads(threads)
        target(*args)
    thread = threading.Thread(target=run, daemon=True, name=name)
    thread.start()
    return thread


class StageWorkers:
    """One thread per stage, microbatches flowing through in order (module note)."""

    def __init__(self, num_stages: int, run_stage: StageFn) -> None:
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.num_stages = num_stages
        self._run_stage = run_stage
        self.times = PipelineTimes(num_stages=num_stages, per_stage=[0.0] * num_stages)
        self.threads = 0  # each stage thread's intra-op threads (as `StageStream`'s)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Each microbatch's last-stage output, in order."""
        if not inputs:
            return []
        inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(self.num_stages + 1)]
        errors: list[BaseException] = []
        busy = [0.0] * self.num_stages
        threads = [threading.Thread(target=self._stage_loop,
                                    args=(k, inboxes[k], inboxes[k + 1], busy, errors),
                                    name=f"pipeline-stage-{k}", daemon=True)
                   for k in range(self.num_stages)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for index, item in enumerate(inputs):
            inboxes[0].put((index, None, item))
        inboxes[0].put(_STOP)
        for t in threads:
            t.join()
        span = time.perf_counter() - started
        if errors:
            raise errors[0]
        outputs: list[Any] = [None] * len(inputs)
        while True:
            got = inboxes[-1].get()
            if got is _STOP:
                break
            index, hidden, _ = got
            outputs[index] = hidden
        self._account(busy, span, len(inputs))
        return outputs

    def _stage_loop(self, k: int, inbox: queue.Queue[Any], outbox: queue.Queue[Any],
                    busy: list[float], errors: list[BaseException]) -> None:
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                got = inbox.get()
                if got is _STOP:
                    outbox.put(_STOP)
                    return
                if errors:
                    continue
                index, hidden, item = got
                began = time.perf_counter()
                try:
                    hidden = self._run_stage(k, hidden, item)
                except BaseException as exc:  # surfaced by `run` on the caller's thread
                    errors.append(exc)
                    continue
                busy[k] += time.perf_counter() - began
                outbox.put((index, hidden, item))

    def _account(self, busy: list[float], span: float, num_micro: int) -> None:
        t = self.times
        t.busy += sum(busy)
        t.span += span
        t.capacity += span * self.num_stages
        t.num_microbatches += num_micro
        t.num_steps += 1
        for k, b in enumerate(busy):
            t.per_stage[k] += b


class StageStream:
    """One long-lived thread per stage; microbatches fed one at a time flow through in
    order, and `next_event` reports each leaving stage 0 and the last stage (module
    note). Stage-seconds go to `times` (`busy`, `per_stage`)."""

    def __init__(self, num_stages: int, run_stage: StageFn, times: PipelineTimes,
                 threads: int = 0, first_on_caller: bool = False) -> None:
        """`threads`: each stage thread's intra-op threads (`stage_threads`; 0: the
        process's count, which each stage thread then opens at once).
        `first_on_caller`: stage 0 runs in `feed`, on the caller's thread (one thread
        hand-off less per microbatch; the caller computes stage 0 while the later stages'
        threads run earlier microbatches)."""
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.num_stages = num_stages
        self._run_stage = run_stage
        self.times = times
        self.threads = threads
        self.first_on_caller = first_on_caller and num_stages > 1
        self._lock = threading.Lock()
        self._events: queue.Queue[Any] = queue.Queue()
        self._inboxes: list[queue.Queue[Any]] = []
        self._threads: list[threading.Thread] = []

    def feed(self, index: int, item: Any) -> None:
        """Microbatch `index` enters stage 0's inbox (threads start on first use)."""
        if not self._threads:
            self._start()
        if not self.first_on_caller:
            self._inboxes[0].put((index, None, item))
            return
        began = time.perf_counter()
        own = torch.get_num_threads()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        try:
            hidden = self._run_stage(0, None, item)
        except BaseException as exc:  # surfaced by `next_event`, as a thread's error
            self._events.put(exc)
            return
        finally:
            torch.set_num_threads(own)
        self._count(0, time.perf_counter() - began)
        self._pass_on(0, index, hidden, item)

    def next_event(self) -> tuple[int, bool, Any]:
        """(microbatch index, whether it left the last stage, the last stage's output or
        None); a stage's error is raised here, on the caller's thread."""
        got = self._events.get()
        if isinstance(got, BaseException):
            raise got
        return cast(tuple[int, bool, Any], got)

    def close(self) -> None:
        """Stop the threads once what was fed has gone through."""
        if not self._inboxes:
            return
        self._inboxes[self._first_thread].put(_STOP)
        for t in self._threads:
            t.join()
        self._threads, self._inboxes = [], []

    @property
    def _first_thread(self) -> int:
        return 1 if self.first_on_caller else 0

    def _start(self) -> None:
        self._inboxes = [queue.Queue() for _ in range(self.num_stages)]
        self._threads = [threading.Thread(target=self._loop, args=(k,),
                                          name=f"pipeline-stream-{k}", daemon=True)
                         for k in range(self._first_thread, self.num_stages)]
        for t in self._threads:
            t.start()

    def _pass_on(self, k: int, index: int, hidden: Any, item: Any) -> None:
        """Stage `k` is done with microbatch `index`: report and hand it on."""
        if k == 0:
            self._events.put((index, False, None))
        if k + 1 < self.num_stages:
            self._inboxes[k + 1].put((index, hidden, item))
        else:
            self._events.put((index, True, hidden))

    def _loop(self, k: int) -> None:
        inbox = self._inboxes[k]
        last = k == self.num_stages - 1
        outbox = None if last else self._inboxes[k + 1]
        if self.threads > 0:  # this thread's OpenMP team (torch's count is per thread)
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                got = inbox.get()
                if got is _STOP:
                    if outbox is not None:
                        outbox.put(_STOP)
                    return
                index, hidden, item = got
                began = time.perf_counter()
                try:
                    hidden = self._run_stage(k, hidden, item)
                except BaseException as exc:  # surfaced by `next_event`
                    self._events.put(exc)
                    continue
                self._count(k, time.perf_counter() - began)
                self._pass_on(k, index, hidden, item)

    def _count(self, k: int, seconds: float) -> None:
        with self._lock:
            self.times.busy += seconds
            self.times.per_stage[k] += seconds
