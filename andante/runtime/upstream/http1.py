"""A small pass-through HTTP/1.1 client for the fleet's requests to its upstreams.

Design note (issue 29, the proxy's added latency). A general client (httpx) spends most
of a proxied request's CPU on machinery a proxy does not need: a connection pool that
scans its connections, request and response models, header normalisation, layered
streams with one task switch per layer per chunk. Here, per upstream:
- a keep-alive pool (`UpstreamPool`): a stack of idle connections, the most recently
  used first; a connection the upstream closed while idle is dropped when met;
- a request is one buffer (head and JSON body) written in one call;
- the response head is parsed minimally: the status, and the few headers that frame the
  body (`content-length`, `transfer-encoding`, `connection`) or are passed on
  (`content-type`);
- the body is read by the protocol itself (`asyncio.Protocol`, no stream reader):
  chunked transfer coding is undone as bytes arrive, and each read's payload goes to the
  caller's `on_data` at once, in the event loop's callback (no task switch per chunk;
  the SSE bytes are never parsed); a caller that will stream a 200 answer names its
  `on_data` with the request (`early`), so the body bytes that come with the head or
  before the caller has resumed go out at once, not one loop turn later (the first
  token's added latency);
- a request whose task is cancelled closes its connection (vLLM and andante abort a
  request whose connection closes); a response that ends cleanly returns its connection
  to the pool unless the upstream said `connection: close`;
- a reused connection that fails before any byte of its answer (the upstream closed it
  while idle, racing our write) is replaced by another, at last a fresh one; any other
  failure is an `UpstreamError` (`ConnectFailed` when no connection could be opened).
There is no read timeout: a stream may be slow; a dead upstream is the prober's job.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE = 512  # idle connections kept per upstream
NO_BODY_STATUSES = frozenset({204, 304})

OnData = Callable[[bytes], None]


class UpstreamError(Exception):
    """The connection failed or the upstream broke HTTP/1.1."""


class ConnectFailed(UpstreamError):
    """No connection could be opened (refused, unreachable, or the connect timed out)."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    content_type: str
    content_length: int | None
    chunked: bool
    keep_alive: bool


def parse_head(raw: bytes) -> Head:
    """The status line and headers (without the blank line); UpstreamError if malformed."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamError(f"malformed status line {lines[0][:80]!r}")
    keep_alive = parts[0] == b"HTTP/1.1"
    content_type, length, chunked = "application/json", None, False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UpstreamError(f"malformed header line {line[:80]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            if not value.strip().isdigit():
                raise UpstreamError(f"bad content-length {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.strip().lower().endswith(b"chunked")
        elif name == b"connection":
            token = value.strip().lower()
            keep_alive = token != b"close" and (keep_alive or token == b"keep-alive")
        elif name == b"content-type":
            content_type = value.strip().decode("latin-1")
    return Head(int(parts[1]), content_type, None if chunked else length, chunked,
                keep_alive)


class Dechunker:
    """Undoes chunked transfer coding incrementally: `feed` returns the payload bytes
    found so far; `done` once the last chunk and the trailers have gone by."""

    __slots__ = ("_buf", "_left", "done")

    def __init__(self) -> None:
        self._buf = b""
        # the current chunk's bytes left (its payload and CRLF); -1: a size line is
        # next, -2: trailers are
        self._left = -1
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        while not self.done:
            if self._left == -1:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > 1024:
                        raise UpstreamError("chunk size line too long")
                    break
                size_text = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise UpstreamError(f"bad chunk size {size_text[:20]!r}") from None
                pos = end + 2
                if size == 0:
                    self._left = -2  # trailers until a blank line
                else:
                    self._left = size + 2
            elif self._left == -2:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                self.done = end == pos
                pos = end + 2
            else:
                take = min(self._left, len(buf) - pos)
                if take <= 0:
                    break
                payload = min(take, self._left - 2)
                if payload > 0:
                    out.append(buf[pos:pos + payload])
                pos += take
                self._left -= take
                if self._left == 0:
                    self._left = -1
        self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to an upstream, one exchange at a time: `send` a request
    (its head comes back), then `read` the whole body or `stream` it to a callback. The
    connection goes back to its pool after a clean end, and is closed on any failure or
    cancellation (`close`; also what a caller that abandons an exchange must call)."""

    def __init__(self, release: Callable[[Connection], None]) -> None:
        self._release = release
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.got_bytes = False  # of the current exchange's answer
        self.head: Head | None = None
        self._head_buf = b""
        self._head_future: asyncio.Future[Head] | None = None
        self._end: asyncio.Future[None] | None = None  # the parser's current exchange
        self._exchange_end: asyncio.Future[None] | None = None  # the caller's
        self._reusable = False
        self._on_data: OnData | None = None
        self._pending: list[bytes] = []  # body bytes read before the caller asked
        self._left: int | None = None  # body bytes left (content-length framing)
        self._dechunker: Dechunker | None = None
        self._early: OnData | None = None  # the current exchange's, for a 200 answer

    # ---- the caller's side -----------------------------------------------------------
    def send(self, request: bytes, early: OnData | None = None) -> asyncio.Future[Head]:
        """Write `request`; the answer's head comes back. `early`: where a 200
        answer's body goes from its first byte (the caller then `stream`s to it)."""
        assert self.transport is not None and self._exchange_end is None
        loop = asyncio.get_running_loop()
        self._head_future = loop.create_future()
        self._end = self._exchange_end = loop.create_future()
        self.got_bytes = False
        self._reusable = False
        self._pending = []
        self.head = None
        self._early = early
        self.transport.write(request)
        return self._head_future

    async def stream(self, on_data: OnData) -> None:
        """Deliver the body to `on_data` as it arrives, until it ends; then the
        connection goes back to its pool (or is closed)."""
        end = self._exchange_end
        assert end is not None
        for piece in self._pending:
            on_data(piece)
        self._pending = []
        self._on_data = on_data
        try:
            await end
        except BaseException:
            self.close()
            raise
        finally:
            self._on_data = self._early = None
            self._exchange_end = None
        if self._reusable and not self.closed:
            self._release(self)
        else:
            self.close()

    async def read(self) -> bytes:
        parts: list[bytes] = []
        await self.stream(parts.append)
        return b"".join(parts)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            if self._end is None:
                raise UpstreamError("bytes from the upstream outside any exchange")
            if self.head is None:
                self._read_head(data)
            else:
                self._read_body(data)
        except UpstreamError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        if self.head is not None and self._left is None and self._dechunker is None:
            self._finish()  # a body framed by the connection's end
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reason = f"{type(exc).__name__}: {exc}" if exc else "closed by the upstream"
        self._fail(UpstreamError(f"connection lost ({reason})"))

    # ---- parsing the answer -----------------------------------------------------------------
    def _read_head(self, data: bytes) -> None:
        buf = self._head_buf + data if self._head_buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise UpstreamError("response head too large")
            self._head_buf = buf
            return
        self._head_buf = b""
        head = parse_head(buf[:end])
        self.head = head
        if head.status in NO_BODY_STATUSES:
            self._left = 0
        elif head.chunked:
            self._dechunker = Dechunker()
        else:
            self._left = head.content_length  # None: until the connection closes
        if head.status == 200 and self._early is not None:
            self._on_data = self._early
        future = self._head_future
        if future is not None and not future.done():
            future.set_result(head)
        rest = buf[end + 4:]
        if rest or self._left == 0:
            self._read_body(rest)

    def _read_body(self, data: bytes) -> None:
        if self._dechunker is not None:
            payload = self._dechunker.feed(data)
            done = self._dechunker.done
        elif self._left is not None:
            payload = data[:self._left]
            self._left -= len(payload)
            done = self._left == 0
        else:
            payload, done = data, False
        if payload:
            if self._on_data is not None:
                self._on_data(payload)
            else:
                self._pending.append(payload)
        if done:
            self._finish()

    def _finish(self) -> None:
        end = self._end
        head = self.head
        self._reset()
        self._reusable = (head is not None and head.keep_alive
                          and (head.chunked or head.content_length is not None
                               or head.status in NO_BODY_STATUSES))
        if end is not None and not end.done():
            end.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        futures = (self._head_future, self._end)
        self.close()  # also an idle one that sent bytes unasked: never reused
        self._reset()
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(exc)
                future.exception()  # marked retrieved: the caller may await only one

    def _reset(self) -> None:
        """The parser's state (what the caller has not taken yet stays)."""
        self._head_future = self._end = None
        self._left = None
        self._dechunker = None


class UpstreamPool:
    """Keep-alive connections to one upstream (`url`: scheme, host, port; a path prefix
    is kept in front of each request's path)."""

    def __init__(self, url: str, connect_timeout: float,
                 tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._host_line = f"Host: {host_header}\r\n".encode("latin-1")
        self.connect_timeout = connect_timeout
        self._idle: list[Connection] = []
        self.num_opened = 0

    async def post(self, path: str, body: bytes, early: OnData | None = None) -> Connection:
        """Send `POST path` with a JSON `body`; the connection, with the answer's head
        read (`conn.head`): read or stream its body next (or `close` it). `early`: see
        `Connection.send`."""
        request = b"".join((
            b"POST ", (self.prefix + path).encode("latin-1"), b" HTTP/1.1\r\n",
            self._host_line,
            b"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: ",
            str(len(body)).encode(), b"\r\n\r\n", body))
        while True:
            conn, reused = self._idle_connection(), True
            if conn is None:
                conn, reused = await self._open(), False
            try:
                await conn.send(request, early)
            except UpstreamError:
                if reused and not conn.got_bytes:
                    continue  # closed by the upstream while idle: a fresh one
                raise
            except BaseException:
                conn.close()
                raise
            return conn

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def _idle_connection(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and conn.transport is not None \
                    and not conn.transport.is_closing():
                return conn
        return None

    def _put_back(self, conn: Connection) -> None:
        if len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self._put_back), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls else None)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: "
                                f"{type(exc).__name__} {exc}".strip()) from None
        self.num_opened += 1
        return conn
