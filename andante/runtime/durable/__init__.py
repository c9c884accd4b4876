"""The durable queue of batch work (DESIGN.md §4): one interface (`DurableStore`),
SQLite by default, Redis Streams for a fleet of controllers."""

from andante.runtime.durable.records import BatchRecord, FileRecord, Outcome, WorkItem
from andante.runtime.durable.store import DurableStore, default_state_dir, open_store

__all__ = ["BatchRecord", "DurableStore", "FileRecord", "Outcome", "WorkItem",
           "default_state_dir", "open_store"]
