"""How a durable store fails (not the caller's fault): the HTTP layer answers 503 / 507,
the feeder waits or fails the batch with the reason."""

from __future__ import annotations


class StoreError(Exception):
    """The store failed; the message says how."""


class StoreUnavailable(StoreError):
    """The store cannot be reached now (Redis down); retry later."""


class StoreFull(StoreError):
    """The store has no room for the write (a full disk, Redis' maxmemory)."""
