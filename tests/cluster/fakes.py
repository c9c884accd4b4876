"""A scriptable `Instance` for controller and router tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from andante.cluster.instance import BASIC_CAPABILITIES, LaterOperations
from andante.cluster.load import LoadReport
from andante.core import Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.engine.stats import SchedulerStats

_STATS_FIELDS = {f.name for f in fields(SchedulerStats)}


def request(rid: str, prompt: int = 32, arrival: float = 0.0, ttft: float | None = None
            ) -> Request:
    return Request(rid, SyntheticTokens(prompt), SamplingParams(max_tokens=8, ignore_eos=True),
                   arrival, slo=SLO(ttft=ttft))


def load_report(base: LoadReport | None = None, **values: Any) -> LoadReport:
    """`base` (default: empty) with `values` set, whether stats or cluster figures;
    `kv_usage=u` sets 100 device blocks with 100 * u in use."""
    base = base or LoadReport()
    if "kv_usage" in values:
        values |= {"num_blocks": 100, "num_free_blocks": round(100 * (1 - values.pop("kv_usage")))}
    stats = {k: v for k, v in values.items() if k in _STATS_FIELDS}
    rest = {k: v for k, v in values.items() if k not in _STATS_FIELDS}
    return replace(base, stats=replace(base.stats, **stats), **rest)


class FakeInstance(LaterOperations):
    capabilities = BASIC_CAPABILITIES

    def __init__(self, index: int, role: str = "", report: LoadReport | None = None) -> None:
        self.index = index
        self.role = role
        self.report = report or LoadReport()
        self.submitted: list[Request] = []
        self.aborted: list[str] = []
        self.withdrawn: list[str] = []
        self.up = True

    @property
    def alive(self) -> bool:
        return self.up

    def submit(self, req: Request) -> None:
        self.submitted.append(req)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def withdraw(self, request_ids: Sequence[str]) -> None:
        self.withdrawn.extend(request_ids)

    def load(self) -> LoadReport:
        return self.report

    def set_load(self, **values: float) -> None:
        self.report = load_report(self.report, **values)
