"""Write a run's per-request metrics (CSV and JSON) and its summary (JSON)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from andante.metrics import RequestRecord, Summary, e2el, qoe_of, tpot, ttft

COLUMNS = (
    "request_id", "arrival_time", "num_prompt_tokens", "num_output_tokens", "finish_reason",
    "ttft", "tpot", "e2el", "qoe", "num_preemptions",
    "slo_ttft", "slo_tbt", "slo_tds", "slo_deadline",
)


def per_request_rows(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        rows.append({
            "request_id": r.request_id, "arrival_time": r.arrival_time,
            "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": len(r.token_times),
            "finish_reason": r.finish_reason, "ttft": ttft(r), "tpot": tpot(r), "e2el": e2el(r),
            "qoe": qoe_of(r) if r.finish_reason is not None else None,
            "num_preemptions": r.num_preemptions, "slo_ttft": r.slo.ttft, "slo_tbt": r.slo.tbt,
            "slo_tds": r.slo.tds, "slo_deadline": r.slo.deadline,
        })
    return rows


def write_run(
    directory: Path, records: Sequence[RequestRecord], summary: Summary, meta: dict[str, Any]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = per_request_rows(records)
    with (directory / "requests.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (directory / "requests.json").write_text(json.dumps(rows))
    (directory / "summary.json").write_text(json.dumps({**meta, **summary.to_dict()}, indent=2))
