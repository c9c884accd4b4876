"""Helpers for the multi-instance serving tests: toy servers and streaming requests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

from andante.server import EngineOptions, ServeOptions


def cluster_options(instances: int = 3, step_time: float = 0.002, max_num_seqs: int = 64,
                    **extra: Any) -> ServeOptions:
    engine = EngineOptions(toy_step_time=step_time, max_num_seqs=max_num_seqs)
    return ServeOptions(model="toy", port=0, log_level="warning", instances=instances,
                        engine=engine, **extra)


@dataclass(slots=True)
class Outcome:
    text: str = ""
    num_chunks: int = 0
    finish: str | None = None
    error: str | None = None
    status: int = 0


async def stream_one(client: httpx.AsyncClient, max_tokens: int, started: asyncio.Event
                     ) -> Outcome:
    body = {"prompt": "hello", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "slo": {"ttft": 5.0, "tbt": 1.0}}
    out = Outcome()
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        out.status = resp.status_code
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                out.error = event["error"]["message"]
                continue
            choice = event["choices"][0]
            if choice["text"]:
                out.num_chunks += 1
                out.text += choice["text"]
                started.set()
            out.finish = choice["finish_reason"] or out.finish
    return out


async def stream_many(url: str, num: int, max_tokens: int, started: asyncio.Event,
                      timeout: float = 120.0) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        return await asyncio.gather(*(stream_one(client, max_tokens, started)
                                      for _ in range(num)))
