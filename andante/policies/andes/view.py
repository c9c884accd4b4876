"""The requests of one decision as numpy arrays: running, then waiting, then swapped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.policies.andes.gain import Streams
from andante.policies.andes.latency import LatencyModel
from andante.policies.andes.state import RequestTable

RUNNING, WAITING, SWAPPED = 0, 1, 2


@dataclass(slots=True)
class View:
    """reqs[i] has state streams[i], kind[i], weight[i] (KV blocks with room for the
    next token) and first-token delay base[i] + step[i]·τ if served."""

    reqs: list[Request]
    num_running: int
    num_waiting: int
    idx: np.ndarray
    streams: Streams
    kind: np.ndarray
    weight: np.ndarray
    base: np.ndarray
    step: np.ndarray

    @classmethod
    def of(cls, table: RequestTable, plan: StepPlan, latency: LatencyModel) -> View:
        reqs = [*plan.running, *plan.waiting, *plan.swapped]
        nr, nw = len(plan.running), len(plan.waiting)
        idx = table.indices(reqs)
        kind = np.full(len(reqs), WAITING, dtype=np.int8)
        kind[:nr] = RUNNING
        kind[nr + nw:] = SWAPPED
        tokens = table.prompt[idx] + table.n[idx]
        weight = np.ceil((tokens + 1.0) / plan.block_size)
        base = np.zeros(len(reqs))
        base[nr:nr + nw] = latency.prefill_time(tokens[nr:nr + nw])
        base[nr + nw:] = latency.swap_time(tokens[nr + nw:])
        step = (kind != WAITING).astype(float)
        return cls(reqs, nr, nw, idx, Streams.take(table, idx), kind, weight, base, step)

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def queued(self) -> slice:
        """Waiting and swapped requests."""
        return slice(self.num_running, len(self.reqs))

    def first_delay(self, tau: np.ndarray) -> np.ndarray:
        """Delay of each request's next token if served at per-token latency `tau`
        (broadcasts: tau of shape (K, 1) gives (K, N))."""
        return self.base + self.step * tau

    def subset(self, positions: np.ndarray) -> Streams:
        s = self.streams
        return Streams(s.start[positions], s.inv[positions], s.n[positions],
                       s.late[positions], s.pos[positions])
