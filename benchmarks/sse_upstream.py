"""A lean OpenAI-compatible streaming upstream for measuring a proxy (benchmarks/fleet.py
--proxy-upstream-kind lean): every stream gets one SSE chunk per `--step-ms` tick, all
streams written by one timer from pre-encoded bytes, so that the upstream itself costs
little CPU and a proxy's own delay is what a comparison through it shows.

    python benchmarks/sse_upstream.py --port 0 --step-ms 20 --model proxy

Serves GET /v1/models, GET /metrics (empty), POST /v1/completions and
/v1/chat/completions (`max_tokens` chunks when `stream` is true, else one JSON answer),
HTTP/1.1 keep-alive. Prints its URL on the first line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

CHUNK = b'data: {"id":"cmpl-lean","object":"text_completion","model":"%s","choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'  # noqa: E501
DONE = b"data: [DONE]\n\n"


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Ticker:
    """Writes the next chunk of every open stream each tick."""

    def __init__(self, step_s: float, chunk: bytes) -> None:
        self.step_s = step_s
        self.chunk = _chunked(chunk)
        self.end = _chunked(DONE) + b"0\r\n\r\n"
        self.streams: list[list[Any]] = []  # [writer, tokens left, done future]
        self._handle: asyncio.TimerHandle | None = None

    def add(self, writer: asyncio.StreamWriter, tokens: int) -> asyncio.Future[None]:
        done = asyncio.get_running_loop().create_future()
        self.streams.append([writer, tokens, done])
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.step_s, self._tick)
        return done

    def _tick(self) -> None:
        alive = []
        for entry in self.streams:
            writer, left, done = entry
            if writer.is_closing():
                done.set_result(None)
                continue
            writer.write(self.chunk)
            entry[1] = left - 1
            if entry[1] <= 0:
                writer.write(self.end)
                done.set_result(None)
            else:
                alive.append(entry)
        self.streams = alive
        self._handle = (asyncio.get_running_loop().call_later(self.step_s, self._tick)
                        if alive else None)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ticker: Ticker,
                 model: str) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            if method == b"GET":
                if path == b"/v1/models":
                    payload = json.dumps({"object": "list", "data": [
                        {"id": model, "object": "model", "owned_by": "openai"}]}).encode()
                else:
                    payload = b""
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
                continue
            request = json.loads(body or b"{}")
            tokens = int(request.get("max_tokens") or 16)
            if not request.get("stream"):
                payload = json.dumps({"object": "text_completion", "model": model, "choices": [
                    {"index": 0, "text": "a" * tokens, "finish_reason": "length"}]}).encode()
                await asyncio.sleep(ticker.step_s * tokens)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            await ticker.add(writer, tokens)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> None:
    ticker = Ticker(args.step_ms / 1000.0, CHUNK % args.model.encode())
    server = await asyncio.start_server(lambda r, w: handle(r, w, ticker, args.model),
                                        "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"lean upstream on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--model", default="proxy")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
