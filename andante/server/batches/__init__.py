"""The OpenAI Batch API on a durable queue (files, batches, the feeder that runs them).

`create_batch_service(state)` opens the store the options name and returns the service;
the app starts it with its lifespan (resuming unfinished batches) and installs the routes.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

from andante.runtime.durable import open_store
from andante.runtime.durable.store import DurableStore
from andante.server.batches.metrics import BatchCollector
from andante.server.batches.service import BatchService
from andante.server.config import BatchOptions
from andante.server.state import ServerState

__all__ = ["BatchService", "OpenedStore", "create_batch_service", "open_batch_store"]


@dataclass(frozen=True, slots=True)
class OpenedStore:
    store: DurableStore
    scratch: str | None  # a temporary state directory, removed when the service stops


def open_batch_store(options: BatchOptions) -> OpenedStore:
    """The store the options name (opened first: a state directory held by another
    server fails before any model loads). Without a state directory (SQLite) it lives
    in a temporary one."""
    state_dir = options.state_dir
    scratch = None
    if options.queue == "sqlite" and state_dir is None:
        state_dir = scratch = tempfile.mkdtemp(prefix="andante-state-")
    store = open_store(options.queue, state_dir, options.consumer or "", options.claim_idle_s)
    return OpenedStore(store, scratch)


def create_batch_service(state: ServerState, opened: OpenedStore | None = None
                         ) -> BatchService:
    """The service over the store (`open_batch_store` of the state's options unless
    given), its metrics registered."""
    options = state.options.batch
    opened = opened or open_batch_store(options)
    store, scratch = opened.store, opened.scratch
    service = BatchService(state, store, options)
    if scratch is not None:
        service.on_closed = lambda: shutil.rmtree(scratch, ignore_errors=True)
    state.metrics.registry.register(BatchCollector(service))
    return service
