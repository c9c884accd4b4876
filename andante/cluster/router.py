"""Routers: which instance gets a new request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from andante.core.request import Request


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What an instance tells the router after each step."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_usage: float


class Router(Protocol):
    """Picks an instance index for `req` given each instance's latest load report."""

    def route(self, req: Request, loads: Sequence[LoadReport]) -> int: ...


class RoundRobinRouter:
    def __init__(self) -> None:
        self._next = 0

    def route(self, req: Request, loads: Sequence[LoadReport]) -> int:
        index = self._next % len(loads)
        self._next = index + 1
        return index
