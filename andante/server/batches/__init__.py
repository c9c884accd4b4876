"""The OpenAI Batch API on a durable queue (files, batches, the feeder that runs them).

`create_batch_service(state)` opens the store the options name and returns the service;
the app starts it with its lifespan (resuming unfinished batches) and installs the routes.
"""

from __future__ import annotations

import shutil
import tempfile

from andante.runtime.durable import open_store
from andante.server.batches.metrics import BatchCollector
from andante.server.batches.service import BatchService
from andante.server.state import ServerState

__all__ = ["BatchService", "create_batch_service"]


def create_batch_service(state: ServerState) -> BatchService:
    """The service over the store of `state.options.batch`, its metrics registered.
    Without a state directory (SQLite) the store lives in a temporary one, removed when
    the service stops."""
    options = state.options.batch
    state_dir = options.state_dir
    scratch = None
    if options.queue == "sqlite" and state_dir is None:
        state_dir = scratch = tempfile.mkdtemp(prefix="andante-state-")
    store = open_store(options.queue, state_dir, options.consumer or "", options.claim_idle_s)
    service = BatchService(state, store, options)
    if scratch is not None:
        service.on_closed = lambda: shutil.rmtree(scratch, ignore_errors=True)
    state.metrics.registry.register(BatchCollector(service))
    return service
