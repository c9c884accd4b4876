"""What the Batch API needs of the server it runs on (`BatchHost`): the engine server's
`ServerState` is one, the fleet's `FleetBatchHost` (andante.server.fleet_batches)
another, so the durable queue feeds engines and upstream servers alike.

The feeder reads the host's models, whether it serves at all, how many requests are in
flight and how many wait for their first token (interactive first: batch work starts
only while none waits), its instances and their batch size (its default share); it
runs each work item through the host's own `ItemRunner` (`runner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from andante.runtime.durable.records import Outcome, WorkItem


class _Engine(Protocol):
    @property
    def max_num_seqs(self) -> int: ...


class HostOptions(Protocol):
    @property
    def instances(self) -> int: ...

    @property
    def max_queued(self) -> int: ...

    @property
    def engine(self) -> _Engine: ...


class _Alive(Protocol):
    @property
    def is_alive(self) -> bool: ...


class _InFlight(Protocol):
    @property
    def num_in_flight(self) -> int: ...

    @property
    def num_not_started(self) -> int: ...


class _Served(Protocol):
    @property
    def served(self) -> Mapping[str, Any]: ...

    @property
    def model_name(self) -> str: ...


class BatchHost(Protocol):
    @property
    def options(self) -> HostOptions: ...

    @property
    def runner(self) -> _Alive: ...

    @property
    def hub(self) -> _InFlight: ...

    @property
    def backend(self) -> _Served: ...

    @property
    def sleep_level(self) -> int | None: ...  # asleep (dev mode): takes no new work


class ItemRunning(Protocol):
    """Runs one work item to its outcome (raising `EngineFailure` when the serving side
    failed under it: it runs again); `streams`: the batch requests in flight, by id;
    `num_not_started`: of them, those still waiting for their first token."""

    @property
    def streams(self) -> Mapping[str, Any]: ...

    @property
    def num_not_started(self) -> int: ...

    async def run(self, item: WorkItem, seconds_left: float) -> Outcome: ...
