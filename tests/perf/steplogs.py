"""Synthetic step logs for the step-log tests: the steps a known profile would time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.step_log import step_record

#: (new tokens, cached tokens) per sequence: prefills, decodes and mixed steps.
CHUNKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((32, 0),), ((96, 0),), ((200, 0),), ((500, 0),), ((120, 0), (64, 0)),
    ((1, 40),), ((1, 300),) * 4, ((1, 100),) * 8, ((1, 900),) * 16, ((1, 60),) * 2,
    ((64, 0), (1, 200), (1, 250)), ((128, 256), (1, 80)),
)


def logged_steps(model: CostModel, chunks=CHUNKS, scale: float = 1.0, **extra: Any
                 ) -> list[dict[str, Any]]:
    """Each step of `chunks` as a step record whose duration `model` predicts (x scale)."""
    records = []
    for step in chunks:
        shape = BatchShape.of(list(step))
        records.append(step_record(shape, model.step_time(shape) * scale,
                                   sum(c for _, c in step), **extra))
    return records


def write_log(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
