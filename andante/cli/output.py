"""Write a run's per-request metrics (CSV and JSON lines, streamed) and its summary (JSON)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from andante.metrics import RequestRecord, Summary, e2el, qoe_of, tpot, ttft

COLUMNS = (
    "request_id", "arrival_time", "num_prompt_tokens", "num_output_tokens", "finish_reason",
    "ttft", "tpot", "e2el", "qoe", "num_preemptions",
    "slo_ttft", "slo_tbt", "slo_tds", "slo_deadline", "rejection_reason",
)


def per_request_row(r: RequestRecord) -> dict[str, Any]:
    return {
        "request_id": r.request_id, "arrival_time": r.arrival_time,
        "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": len(r.token_times),
        "finish_reason": r.finish_reason, "ttft": ttft(r), "tpot": tpot(r), "e2el": e2el(r),
        "qoe": qoe_of(r) if r.finish_reason is not None else None,
        "num_preemptions": r.num_preemptions, "slo_ttft": r.slo.ttft, "slo_tbt": r.slo.tbt,
        "slo_tds": r.slo.tds, "slo_deadline": r.slo.deadline,
        "rejection_reason": r.rejection_reason,
    }


def per_request_rows(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    return [per_request_row(r) for r in records]


@contextmanager
def record_files(directory: Path) -> Iterator[Callable[[RequestRecord], None]]:
    """A sink that appends each record to `directory`/requests.csv and requests.jsonl as
    it comes (a run's records need not be held to be written)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "requests.csv").open("w", newline="") as table, \
            (directory / "requests.jsonl").open("w") as lines:
        writer = csv.DictWriter(table, fieldnames=COLUMNS)
        writer.writeheader()

        def write(record: RequestRecord) -> None:
            row = per_request_row(record)
            writer.writerow(row)
            lines.write(json.dumps(row) + "\n")

        yield write


def write_summary(directory: Path, summary: Summary, meta: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps({**meta, **summary.to_dict()}, indent=2))
