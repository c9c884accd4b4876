"""A scriptable `Instance` for controller and router tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from andante.cluster.instance import BASIC_CAPABILITIES, LaterOperations
from andante.cluster.load import LoadReport
from andante.core import Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO


def request(rid: str, prompt: int = 32, arrival: float = 0.0, ttft: float | None = None
            ) -> Request:
    return Request(rid, SyntheticTokens(prompt), SamplingParams(max_tokens=8, ignore_eos=True),
                   arrival, slo=SLO(ttft=ttft))


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

    def set_load(self, **fields: float) -> None:
        self.report = replace(self.report, **fields)  # type: ignore[arg-type]
