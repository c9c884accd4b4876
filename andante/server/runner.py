"""The server's runner: the cluster controller on the event loop.

Design note (DESIGN.md §4, rule 6): the web layer talks to the runner (submit, abort,
start, stop, stats) and every server is a cluster, of one instance by default. The
controller lives on the asyncio loop thread, where requests arrive; every instance hands
each of its step messages to the loop (`call_soon_threadsafe`, one call per engine step), where
the runner delivers the step's deltas to the streams and tells the controller what
finished and what was handed back. The controller's ownership is the truth: output for a
request from an instance that no longer owns it (e.g. a restarted Ray actor that still
got it after the controller re-queued it) is dropped and aborted there. When an instance
goes down, its requests that have not streamed a token are re-queued on the others; the
ones that have get an "error" finish (a clear 500 / SSE error), none is lost silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from andante.cluster.controller import ClusterOperator, Controller
from andante.cluster.load import total_stats
from andante.cluster.qlm.tiers import ModelSwap
from andante.cluster.router import Router
from andante.core.request import Request
from andante.engine.stats import SchedulerStats
from andante.runtime.local import MultiModelInstance
from andante.runtime.ray_actors import RayMultiModelInstance
from andante.runtime.worker import HostedInstance, StepMessage
from andante.server.outputs import Delta

log = logging.getLogger("andante.server")

Deliver = Callable[[list[Delta]], None]
OnFailure = Callable[[BaseException], None]


class ClusterRunner:
    def __init__(self, instances: list[HostedInstance], router: Router,
                 operators: Sequence[ClusterOperator] = ()) -> None:
        self.instances = instances
        self.controller = Controller(instances, router, operators)
        self.stats = self._total()  # the cluster's figures as one engine's
        self.error: BaseException | None = None
        self._started: set[str] = set()  # requests that streamed at least one token
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Deliver | None = None
        self._on_failure: OnFailure | None = None
        self._swap_observers: list[Callable[[list[ModelSwap]], None]] = []
        self.num_model_swaps = 0

    def add_swap_observer(self, observer: Callable[[list[ModelSwap]], None]) -> None:
        """`observer(swaps)` on the loop thread after each step that swapped a model."""
        self._swap_observers.append(observer)

    # ---- loop thread ----------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Place the request (its instance detokenizes it)."""
        self.controller.submit(req)

    def abort(self, request_id: str) -> None:
        self.controller.abort(request_id)

    @property
    def is_alive(self) -> bool:
        return self.error is None and any(inst.alive for inst in self.instances)

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver,
              on_failure: OnFailure) -> None:
        self._loop, self._deliver, self._on_failure = loop, deliver, on_failure

        def post(message: StepMessage) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._on_message, message)

        def on_down(index: int, exc: BaseException | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._on_down, index, exc)

        def on_up(index: int, _: BaseException | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self.controller.instance_recovered, index)

        for inst in self.instances:
            inst.start(post, on_down, on_up)

    def stop(self, timeout: float = 10.0) -> None:
        for inst in self.instances:
            inst.stop(timeout)

    def _on_message(self, message: StepMessage) -> None:
        index = message.index
        inst = self.instances[index]
        inst.observe(message)
        if message.swaps:
            self.num_model_swaps += len(message.swaps)
            for observer in self._swap_observers:
                observer(message.swaps)
        owner = self._owner_view(index)
        deltas: list[Delta] = []
        for delta in message.outputs:
            if owner(delta.request_id) == index:
                deltas.append(delta)
                if delta.num_new_tokens:
                    self._started.add(delta.request_id)
                if delta.finish_reason is not None:
                    self._started.discard(delta.request_id)
            elif delta.finish_reason is None:
                inst.abort(delta.request_id)  # a stray: someone else serves it now
        if deltas and self._deliver is not None:
            self._deliver(deltas)
        finished = [rid for rid in message.finished_ids if owner(rid) == index]
        handoffs = [req for req in message.handoffs if owner(req.request_id) == index]
        self.controller.on_step(index, finished, handoffs)
        self.stats = self._total()

    def _owner_view(self, index: int) -> Callable[[str], int | None]:
        """Who owns a request, as instance `index` should see it: a KunServe group's
        member counts its leader's requests as its own (its last step's output may
        arrive after the coordinator handed its requests to the leader)."""
        owner = self.controller.owner_of
        leader = getattr(self.instances[index], "group_leader", None)
        if leader is None:
            return owner
        return lambda rid: index if owner(rid) in (index, leader) else owner(rid)

    def _on_down(self, index: int, exc: BaseException | None) -> None:
        outcome = self.controller.instance_failed(index, self._started.__contains__)
        log.error("instance %d is down (%s): %d request(s) re-queued, %d failed", index,
                  exc, len(outcome.requeued), len(outcome.failed))
        failed = [Delta(rid, "", 0, 0, finish_reason="error") for rid in outcome.failed]
        for rid in outcome.failed:
            self._started.discard(rid)
        if failed and self._deliver is not None:
            self._deliver(failed)
        if not any(inst.alive or inst.restartable for inst in self.instances):
            self.error = exc or RuntimeError("every instance is down")
            self.controller.queue.clear()
            if self._on_failure is not None:
                self._on_failure(self.error)  # every open stream ends with an error

    # ---- figures --------------------------------------------------------------------
    def _total(self) -> SchedulerStats:
        return total_stats([inst.load().stats for inst in self.instances],
                           len(self.controller.queue))

    def cluster_stats(self) -> dict[str, Any]:
        """Per-instance load reports and the router's counters (for /api/stats)."""
        router = self.controller.router
        return {
            "router": router.name,
            "instances": [_instance_stats(inst) for inst in self.instances],
            "queued": len(self.controller.queue),
            "handoffs": self.controller.num_handoffs,
            "requeued": self.controller.num_requeued,
            "model_swaps": self.num_model_swaps,
            **{name: getattr(router, name) for name in ("num_ticketed", "num_offloads")
               if hasattr(router, name)},
        }


def _instance_stats(inst: HostedInstance) -> dict[str, Any]:
    load = inst.load()
    extra: dict[str, Any] = {}
    if isinstance(inst, (MultiModelInstance, RayMultiModelInstance)):  # device and warm
        extra["device_model"], extra["warm_models"] = inst.models()
    return {"index": inst.index, "role": inst.role, "alive": inst.alive,
            **asdict(load), "stats": stats_dict(load.stats), **extra}


def stats_dict(stats: SchedulerStats) -> dict[str, Any]:
    """The stats as JSON (with the KV usage)."""
    return {**asdict(stats), "kv_usage": stats.kv_usage}
