"""An async streaming client for any OpenAI-compatible server, with the token pacer.

`StreamingClient.stream(...)` sends one streaming request and records when each text
chunk arrived, giving a `StreamResult` whose `record` feeds andante.metrics (ttft, tpot,
itl, e2el, QoE; times in seconds of the client's clock, from the moment the request
was sent). `StreamingClient.paced(...)` also releases the text at the reader's pace
through a `TokenPacer` and reports the QoE the reader actually experienced.

Token accounting: every chunk carrying text counts as one token arriving; when the
server reports `usage.completion_tokens` larger than the number of such chunks (tokens
that arrived together, or decoded to no text), the extra tokens are counted as arriving
with the last chunk, so the record has exactly the server's number of output tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from andante.client.pacer import TokenPacer
from andante.client.sse import chunk_finish_reason, chunk_text, iter_events
from andante.core.sampling import SLO
from andante.metrics import DEFAULT_TTFT_TARGET, RequestRecord, qoe_of

OnToken = Callable[[str, float], None]


class ClientError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class StreamResult:
    text: str
    record: RequestRecord
    usage: dict[str, int] | None = None
    response_id: str | None = None
    error: str | None = None

    @property
    def qoe(self) -> float:
        """QoE of the arrival timeline (what a reader pacing perfectly would get)."""
        return qoe_of(self.record)


def slo_body(slo: SLO) -> dict[str, float]:
    fields = {"ttft": slo.ttft, "tbt": slo.tbt, "tds": slo.tds, "deadline": slo.deadline}
    return {k: v for k, v in fields.items() if v is not None}


#: `owned_by` of a vLLM server's models: its SLO fields go in `vllm_xargs` (flat keys,
#: read by andante's scheduler class in vLLM, andante.vllm) instead of andante's `slo`
VLLM_OWNER = "vllm"


def add_slo(body: dict[str, Any], slo: SLO, server_owner: str | None) -> None:
    """Put the request's SLO where the server reads it: andante's `slo` object, or a
    vLLM server's `vllm_xargs` (merged with any the caller set)."""
    fields = slo_body(slo)
    if not fields:
        return
    if server_owner == VLLM_OWNER:
        body["vllm_xargs"] = {**body.get("vllm_xargs", {}), **fields}
    else:
        body["slo"] = fields


@dataclass(slots=True)
class _Observed:
    times: list[float] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    finish: str | None = None
    usage: dict[str, int] | None = None
    response_id: str | None = None


class StreamingClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        *,
        timeout: float = 600.0,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.server_owner: str | None = None  # the served model's owned_by (/v1/models)
        self._owner_known = False
        self.clock = clock
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self._http = http or httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout, connect=30.0), limits=limits
        )

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _url(self, path: str) -> str:
        root = self.base_url if self.base_url.endswith("/v1") else self.base_url + "/v1"
        return root + path

    async def resolve_model(self) -> str:
        """The model to ask for: the one given, else the server's first."""
        if self.model is None:
            await self._read_models()
        assert self.model is not None
        return self.model

    async def resolve_server_owner(self) -> str | None:
        """The server's `owned_by` ("vllm" for vLLM, "andante" for andante); None if
        /v1/models does not say. Asked once."""
        if not self._owner_known:
            await self._read_models()
        return self.server_owner

    async def _read_models(self) -> None:
        response = await self._http.get(self._url("/models"))
        if response.status_code != 200:
            raise ClientError(response.status_code, response.text)
        models = response.json()["data"]
        chosen = next((m for m in models if m["id"] == self.model), models[0])
        self.model = self.model or str(chosen["id"])
        owner = chosen.get("owned_by")
        self.server_owner = str(owner) if owner is not None else None
        self._owner_known = True

    async def body(
        self, prompt: str | Sequence[int] | None, messages: Sequence[dict[str, str]] | None,
        max_tokens: int | None, slo: SLO | None, priority: int | None, extra: dict[str, Any],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": await self.resolve_model(), "stream": True,
                                "stream_options": {"include_usage": True}}
        if messages is not None:
            body["messages"] = list(messages)
        elif prompt is not None:
            body["prompt"] = prompt if isinstance(prompt, str) else list(prompt)
        else:
            raise ValueError("give a prompt or messages")
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if priority is not None:
            body["priority"] = priority
        body = {**body, **extra}
        if slo is not None and slo_body(slo):
            add_slo(body, slo, await self.resolve_server_owner())
        return body

    async def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[dict[str, str]] | None = None,
        max_tokens: int | None = None,
        slo: SLO | None = None,
        priority: int | None = None,
        extra: dict[str, Any] | None = None,
        on_token: OnToken | None = None,
        request_id: str = "",
    ) -> StreamResult:
        """Send one streaming request; raises ClientError on an HTTP error status."""
        body = await self.body(prompt, messages, max_tokens, slo, priority, dict(extra or {}))
        path = "/chat/completions" if messages is not None else "/completions"
        seen = _Observed()
        sent = self.clock()
        error: str | None = None
        try:
            await self._receive(path, body, seen, on_token)
        except (httpx.HTTPError, ValueError) as exc:  # broken connection or bad stream
            error = f"{type(exc).__name__}: {exc}"
        times = _reconcile(seen.times, seen.usage, self.clock())
        finish = seen.finish if error is None and seen.finish is not None else "error"
        record = RequestRecord(
            request_id=request_id or seen.response_id or "", arrival_time=sent,
            token_times=tuple(times), slo=slo or SLO(), finish_reason=finish,
            num_prompt_tokens=(seen.usage or {}).get("prompt_tokens", 0),
            max_tokens=max_tokens if max_tokens is not None and max_tokens >= len(times) else None,
        )
        return StreamResult("".join(seen.parts), record, seen.usage, seen.response_id, error)

    async def _receive(
        self, path: str, body: dict[str, Any], seen: _Observed, on_token: OnToken | None
    ) -> None:
        async with self._http.stream("POST", self._url(path), json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise ClientError(response.status_code, _error_message(response))
            async for event in iter_events(response):
                now = self.clock()
                if "error" in event:
                    raise ValueError(str(event["error"]))
                seen.response_id = seen.response_id or event.get("id")
                if event.get("usage"):
                    seen.usage = event["usage"]
                text = chunk_text(event)
                if text:
                    seen.times.append(now)
                    seen.parts.append(text)
                    if on_token is not None:
                        on_token(text, now)
                seen.finish = chunk_finish_reason(event) or seen.finish

    def paced(self, tds: float, **kwargs: Any) -> PacedStream:
        """A stream whose text is released at `tds` tokens/s (see `PacedStream`)."""
        return PacedStream(self, tds, kwargs)


def _reconcile(times: list[float], usage: dict[str, int] | None, now: float) -> list[float]:
    reported = (usage or {}).get("completion_tokens")
    if reported is not None and reported > len(times):
        return times + [times[-1] if times else now] * (reported - len(times))
    return times


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


class PacedStream:
    """Iterate for text at the reader's pace; afterwards `result` holds the stream's
    `StreamResult` and `experienced_qoe` the QoE of the paced release timeline."""

    def __init__(self, client: StreamingClient, tds: float, kwargs: dict[str, Any]) -> None:
        self._client = client
        self._kwargs = kwargs
        self.pacer = TokenPacer(tds, client.clock)
        self.result: StreamResult | None = None
        self.experienced_qoe: float | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        pacer = self.pacer
        task = asyncio.create_task(self._client.stream(on_token=pacer.push, **self._kwargs))
        task.add_done_callback(lambda _: pacer.close())
        try:
            async for token in pacer:
                yield token.text
            self.result = await task
        finally:
            if not task.done():
                task.cancel()
        slo: SLO | None = self._kwargs.get("slo")
        target = slo.ttft if slo is not None and slo.ttft is not None else DEFAULT_TTFT_TARGET
        self.experienced_qoe = pacer.experienced_qoe(self.result.record.arrival_time, target)
