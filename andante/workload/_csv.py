"""Reading named columns of a CSV file, with errors that name the file and the problem."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def read_columns(path: str | Path, columns: Sequence[str]) -> dict[str, list[str]]:
    """Return the raw text of `columns` (header names, exact) of the CSV at `path`.

    Raises ValueError naming the path for a missing or unreadable file, a missing header,
    missing columns, or a file without data rows.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    try:
        with file.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [name.strip() for name in next(reader, [])]
            missing = [name for name in columns if name not in header]
            if missing:
                raise ValueError(
                    f"{file}: missing column(s) {', '.join(missing)}; "
                    f"header has {', '.join(header) or 'nothing'}"
                )
            indices = [header.index(name) for name in columns]
            num_fields = max(indices) + 1
            values: dict[str, list[str]] = {name: [] for name in columns}
            for row_number, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) < num_fields:
                    raise ValueError(
                        f"{file}: line {row_number} has {len(row)} fields, expected {len(header)}"
                    )
                for name, index in zip(columns, indices, strict=True):
                    values[name].append(row[index].strip())
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{file}: cannot read CSV ({exc})") from exc
    if not values[columns[0]]:
        raise ValueError(f"{file}: no data rows")
    return values


def to_int_array(path: str | Path, column: str, texts: list[str]) -> np.ndarray:
    """Parse a column of integer token counts (a trailing '.0' is accepted)."""
    try:
        numbers = np.array([float(text) for text in texts], dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{path}: column {column} has a non-numeric value ({exc})") from exc
    if not np.all(np.isfinite(numbers)) or np.any(numbers != np.round(numbers)):
        raise ValueError(f"{path}: column {column} must hold whole numbers")
    if np.any(numbers < 0):
        raise ValueError(f"{path}: column {column} has a negative value")
    return numbers.astype(np.int64)
