"""A plain-asyncio network backend for the fleet's forwarding connections.

httpcore's default backend goes through anyio, which opens a cancel scope around every
socket read and write even without a timeout; on a relay of hundreds of token streams
that is a large share of the CPU spent per SSE chunk. This backend reads and writes with
asyncio's streams directly (`asyncio.wait_for` only where a timeout is given: connects
and probes) and raises httpcore's exceptions, so httpx maps them as usual.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import httpcore
import httpx
from httpcore._utils import is_socket_readable

T = TypeVar("T")
READ_ERRORS = (ConnectionError, OSError, asyncio.IncompleteReadError)


async def _bounded(awaitable: Awaitable[T], timeout: float | None,
                   on_timeout: type[Exception]) -> T:
    if timeout is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError:
        raise on_timeout(f"timed out after {timeout:g} s") from None


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await _bounded(self._reader.read(max_bytes), timeout, httpcore.ReadTimeout)
        except READ_ERRORS as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            await _bounded(self._writer.drain(), timeout, httpcore.WriteTimeout)
        except READ_ERRORS as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        try:
            await _bounded(self._writer.start_tls(ssl_context, server_hostname=server_hostname),
                           timeout, httpcore.ConnectTimeout)
        except (ssl.SSLError, *READ_ERRORS) as exc:
            self._writer.close()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        sock: socket.socket | None = self._writer.get_extra_info("socket")
        if info == "is_readable":
            return sock is not None and is_socket_readable(sock)
        if info == "socket":
            return sock
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        try:
            reader, writer = await _bounded(
                asyncio.open_connection(host, port, local_addr=local, limit=2 ** 20),
                timeout, httpcore.ConnectTimeout)
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        try:
            reader, writer = await _bounded(asyncio.open_unix_connection(path),
                                            timeout, httpcore.ConnectTimeout)
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def forwarding_transport(limits: httpx.Limits, tls: ssl.SSLContext) -> httpx.AsyncHTTPTransport:
    """httpx's transport with its connection pool on `AsyncioBackend`."""
    transport = httpx.AsyncHTTPTransport(limits=limits, verify=tls)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=tls, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, network_backend=AsyncioBackend())
    return transport
