"""The fleet front's HTTP protocol: uvicorn's httptools protocol with andante's request
timeouts where httptools is installed (its parser is C), else the timed h11 one."""

from __future__ import annotations

import asyncio

from andante.server.config import HTTPLimits
from andante.server.timeouts import h11_protocol


def fast_protocol(limits: HTTPLimits) -> type[asyncio.Protocol]:
    """The timed httptools protocol where httptools is installed (the `server` extra:
    the fleet front's hot path), else the timed h11 one."""
    try:
        from andante.server.timeouts_httptools import httptools_protocol
    except ImportError:  # no httptools
        return h11_protocol(limits)
    return httptools_protocol(limits)
