"""The HTTP load generator: replay a workload against an OpenAI-compatible server.

Each `RequestSpec` is sent at its arrival time (seconds from the run's start, already
rate-scaled by the workload builder) as one streaming request; the client records when
every token arrived (`andante.client`), and the run is summarized with the same
functions as simulated runs (`andante.metrics.summarize`): the `vllm bench serve`
figures, QoE, SLO attainment and goodput. Times are client-side, from the moment each
request was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from andante.bench.prompts import PromptFormat, synthesize
from andante.client import ClientError, StreamingClient, StreamResult
from andante.metrics import RequestRecord, Summary, summarize
from andante.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    prompt_format: PromptFormat = field(default_factory=lambda: PromptFormat("tokens"))
    send_objectives: bool = True  # send each request's slo and priority (andante's fields)
    ignore_eos: bool = True  # generate exactly the workload's output lengths
    temperature: float = 0.0
    max_concurrency: int | None = None
    timeout: float = 600.0
    seed: int = 0
    goodput: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")
        if self.endpoint == "chat" and self.prompt_format.kind == "tokens":
            raise ValueError("the chat endpoint needs --prompt-format text")


@dataclass(frozen=True, slots=True)
class BenchRun:
    model: str
    records: list[RequestRecord]
    summary: Summary
    duration: float
    errors: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "num_errors": len(self.errors),
                "errors": self.errors[:10], **self.summary.to_dict()}


OnDone = Callable[[StreamResult], None]


async def _one(
    client: StreamingClient, cfg: BenchConfig, spec: RequestSpec, prompt: str | list[int],
    index: int,
) -> StreamResult:
    extra: dict[str, Any] = {"temperature": cfg.temperature}
    if cfg.ignore_eos:
        extra["ignore_eos"] = True
    if spec.model:  # a workload's model mix: each request names its model
        extra["model"] = spec.model
    slo = spec.slo if cfg.send_objectives else None
    priority = spec.priority if cfg.send_objectives and spec.priority else None
    rid = f"bench-{index}"
    sent = client.clock()
    try:
        if cfg.endpoint == "chat":
            messages = [{"role": "user", "content": str(prompt)}]
            result = await client.stream(messages=messages, max_tokens=spec.output_len, slo=slo,
                                         priority=priority, extra=extra, request_id=rid)
        else:
            result = await client.stream(prompt, max_tokens=spec.output_len, slo=slo,
                                         priority=priority, extra=extra, request_id=rid)
    except ClientError as exc:
        record = RequestRecord(rid, sent, slo=spec.slo, finish_reason="rejected")
        return StreamResult("", record, error=str(exc))
    # judge QoE and SLOs by the workload's objectives even when they were not sent
    return replace(result, record=replace(result.record, slo=spec.slo,
                                          num_prompt_tokens=result.record.num_prompt_tokens
                                          or spec.prompt_len))


async def run_bench(
    specs: Sequence[RequestSpec], cfg: BenchConfig, on_done: OnDone | None = None
) -> BenchRun:
    """Replay `specs` against `cfg.base_url`; returns records with times from the start."""
    rng = np.random.default_rng(cfg.seed)
    prompts = [synthesize(cfg.prompt_format, s.prompt_len, rng) for s in specs]
    clock = time.perf_counter
    async with StreamingClient(cfg.base_url, cfg.api_key, cfg.model, timeout=cfg.timeout,
                               clock=clock) as client:
        model = await client.resolve_model()
        limit = asyncio.Semaphore(cfg.max_concurrency or len(specs) or 1)

        async def send(i: int) -> StreamResult:
            async with limit:
                result = await _one(client, cfg, specs[i], prompts[i], i)
            if on_done is not None:
                on_done(result)
            return result

        start = clock()
        tasks = []
        for i, spec in enumerate(specs):
            delay = start + spec.arrival_time - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i)))
        results = await asyncio.gather(*tasks)
        duration = clock() - start
    records = [_shift(r.record, start) for r in results]
    summary = summarize(records, duration=max(duration, 1e-9), goodput_thresholds=cfg.goodput)
    errors = [r.error for r in results if r.error]
    return BenchRun(model, records, summary, duration, errors)


def _shift(record: RequestRecord, origin: float) -> RequestRecord:
    return replace(record, arrival_time=record.arrival_time - origin,
                   token_times=tuple(t - origin for t in record.token_times))
