"""The Batch API on a fleet: the durable queue (SQLite or Redis Streams) feeding
upstream servers through the fleet's routers.

The same `BatchService` and feeder as on the engine server (andante.server.batches),
over a `FleetBatchHost`: interactive first (batch work starts only while no interactive
request waits for its first token), a share of each upstream's batch slots, and each
item forwarded as a non-streamed request with the batch's deadline as its SLO and a
low priority (`BATCH_PRIORITY`), so a queue router (qlm) and the upstreams' own
SLO-aware policies see it for what it is. An upstream's refusal (429, 5xx after the
fleet's retries) or a lost upstream counts as a serving failure: the item runs again
(the feeder's `MAX_ATTEMPTS`); an upstream's 4xx is the item's own answer.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from andante.core.sampling import SLO
from andante.runtime.durable import open_store
from andante.runtime.durable.records import Outcome, WorkItem
from andante.runtime.upstream.call import Call, Failure, Full, slo_from
from andante.runtime.upstream.fleet import Fleet
from andante.server.admission import new_request_id
from andante.server.batches.execute import (
    BATCH_PRIORITY,
    MIN_DEADLINE_S,
    EngineFailure,
    response_outcome,
)
from andante.server.batches.service import BatchService
from andante.server.config import BatchOptions
from andante.server.errors import error_body

DEFAULT_MAX_QUEUED = 256


@dataclass(frozen=True, slots=True)
class _Engine:
    max_num_seqs: int


@dataclass(frozen=True, slots=True)
class FleetHostOptions:
    instances: int
    max_queued: int
    engine: _Engine


class FleetBatchHost:
    """The fleet as the Batch API's host (`andante.server.batches.host.BatchHost`)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        slots = min(u.max_num_seqs for u in fleet.upstreams)
        self.options = FleetHostOptions(len(fleet.upstreams), DEFAULT_MAX_QUEUED,
                                        _Engine(slots))
        self.runner = self
        self.hub = self
        self.backend = self
        self.sleep_level: int | None = None  # a fleet front never sleeps

    @property
    def is_alive(self) -> bool:
        return self.fleet.alive

    @property
    def num_in_flight(self) -> int:
        return len(self.fleet.calls)

    @property
    def num_not_started(self) -> int:
        return self.fleet.num_not_started

    @property
    def served(self) -> Mapping[str, Any]:
        return dict.fromkeys(self.fleet.models)

    @property
    def model_name(self) -> str:
        return self.fleet.models[0]


class FleetItemRunner:
    """Runs work items through the fleet (`ItemRunning`)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.streams: dict[str, Call] = {}

    @property
    def num_not_started(self) -> int:
        return 0  # non-streamed: their first token is not seen

    async def run(self, item: WorkItem, seconds_left: float) -> Outcome:
        body = json.loads(item.body)
        if body.get("stream"):
            return response_outcome(item, 400, None, error_body(
                400, "stream: streaming is not available in a batch", "stream",
                "invalid_value"))
        call = self._call(item, body, seconds_left)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        self.streams[call.request_id] = call
        self.fleet.submit(call, len(item.body) // 4,
                          max_tokens if isinstance(max_tokens, int) and max_tokens > 0
                          else None, BATCH_PRIORITY)
        try:
            event = await call.events.get()
        finally:
            del self.streams[call.request_id]
            if not call.finished:
                self.fleet.abort(call.request_id)
        return self._outcome(item, call, event)

    def _call(self, item: WorkItem, body: dict[str, Any], seconds_left: float) -> Call:
        given = body.pop("slo", None)
        own = slo_from(body, SLO(**given) if isinstance(given, dict) else None)
        deadline = max(MIN_DEADLINE_S, seconds_left if own.deadline is None
                       else min(own.deadline, seconds_left))
        slo = SLO(ttft=own.ttft, tbt=own.tbt, tds=own.tds, deadline=deadline)
        body["model"] = item.model
        body["priority"] = max(int(body.get("priority", 0)), BATCH_PRIORITY)
        prefix = "chatcmpl" if item.url.endswith("chat/completions") else "cmpl"
        now = self.fleet.clock.now()
        return Call(new_request_id(prefix), item.model, item.url, body, slo, False, now,
                    now + deadline)

    @staticmethod
    def _outcome(item: WorkItem, call: Call, event: Any) -> Outcome:
        if isinstance(event, Failure):
            raise EngineFailure(f"{item.custom_id!r}: {event.message}")
        assert isinstance(event, Full)
        if event.status == 429 or event.status >= 500:
            raise EngineFailure(f"{item.custom_id!r}: the upstreams answered {event.status}")
        try:
            answer = json.loads(event.content)
        except ValueError:
            answer = error_body(502, "the upstream's answer is not JSON", None,
                                "upstream_error")
        return response_outcome(item, event.status, call.request_id, answer)


def create_fleet_batch_service(fleet: Fleet, options: BatchOptions) -> BatchService:
    """The Batch API over the fleet, on the store `options` names (a temporary SQLite
    directory, removed at stop, when none is given)."""
    state_dir, scratch = options.state_dir, None
    if options.queue == "sqlite" and state_dir is None:
        state_dir = scratch = tempfile.mkdtemp(prefix="andante-fleet-state-")
    store = open_store(options.queue, state_dir, options.consumer or "", options.claim_idle_s)
    service = BatchService(FleetBatchHost(fleet), store, options,
                           runner=lambda: FleetItemRunner(fleet))
    if scratch is not None:
        service.on_closed = lambda: shutil.rmtree(scratch, ignore_errors=True)
    return service
