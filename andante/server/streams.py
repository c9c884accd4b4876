"""Loop-side routing of engine output to per-request streams.

Every in-flight HTTP request owns a `RequestStream` (an asyncio queue of `Delta`s).
`StreamHub.deliver` is what the engine thread schedules once per step: it runs on the
event loop, puts each delta on its stream and tells the observers (metrics, live page)
about tokens and finished requests. All of it runs on the loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from andante.server.outputs import Delta


@dataclass(slots=True)
class RequestStream:
    request_id: str
    num_prompt_tokens: int
    queue: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    finished: bool = False
    started: bool = False  # got its first delta

    async def next_batch(self) -> list[Delta]:
        """Wait for at least one delta; return every delta already queued."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        return items


Observer = Callable[[list[Delta]], None]


class StreamHub:
    def __init__(self) -> None:
        self._streams: dict[str, RequestStream] = {}
        self._observers: list[Observer] = []
        self._num_not_started = 0

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def open(self, request_id: str, num_prompt_tokens: int) -> RequestStream:
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id!r}")
        stream = RequestStream(request_id, num_prompt_tokens)
        self._streams[request_id] = stream
        self._num_not_started += 1
        return stream

    def close(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None and not stream.started:
            stream.started = True
            self._num_not_started -= 1

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_not_started(self) -> int:
        """Requests still waiting for their first token (the admission queue)."""
        return self._num_not_started

    def deliver(self, deltas: list[Delta]) -> None:
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            if not stream.started:
                stream.started = True
                self._num_not_started -= 1
            if delta.finish_reason is not None:
                stream.finished = True
                del self._streams[delta.request_id]
            stream.queue.put_nowait(delta)
        for observer in self._observers:
            observer(deltas)

    def fail_all(self) -> None:
        """The engine died: end every stream with an error delta."""
        for rid, stream in list(self._streams.items()):
            stream.finished = True
            stream.queue.put_nowait(Delta(rid, "", 0, 0, finish_reason="error"))
        self._streams.clear()
        self._num_not_started = 0
