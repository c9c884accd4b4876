"""Live toy servers for the server, client and bench tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from andante.server import EngineOptions, ServeOptions, ServerThread


def toy_options(max_queued: int = 256, api_key: str | None = None, policy: str = "vllm",
                **engine: Any) -> ServeOptions:
    engine.setdefault("toy_step_time", 0.002)
    return ServeOptions(model="toy", port=0, max_queued=max_queued, api_key=api_key,
                        policy=policy, engine=EngineOptions(**engine), log_level="warning")


@contextmanager
def toy_server(**kwargs: Any) -> Iterator[ServerThread]:
    server = ServerThread(toy_options(**kwargs)).start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
