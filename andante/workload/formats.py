"""Trace file formats: CSV or JSONL, with the columns of common public traces known by name.

A trace is a table with one row per request: an arrival time, a prompt length and an
output length (tokens). The file is JSONL (one JSON object per line) if its name ends in
.jsonl or .json or its first character is '{', else CSV with a header row. The columns
are recognised by name (the first of `KNOWN_FORMATS` whose columns are all present):

* azure — Azure LLM inference traces 2023 and 2024 (TIMESTAMP as date-time text,
  ContextTokens, GeneratedTokens); Splitwise replays these same files;
* burstgpt — BurstGPT (Timestamp in seconds, Request tokens, Response tokens);
* mooncake — Mooncake's JSONL (timestamp in milliseconds, input_length, output_length,
  and hash_ids: the ids of the prompt's 512-token blocks, equal ids for equal content,
  which become the simulated prompts' `PrefixIds` for prefix caching);
* vidur — Vidur's and Splitwise's processed traces (arrived_at in seconds,
  num_prefill_tokens, num_decode_tokens);
* sharegpt — lengths only (num_prefill_tokens, num_decode_tokens), no arrival times.

Any other table is read through an explicit mapping, "time=COL,prompt=COL,output=COL"
plus optionally "unit=s|ms|us|ns" (the unit of a numeric time column; date-time text
needs none) and "ids=COL[,span=N]" (a JSONL column of block content ids of N tokens
each; by default a mapped file's "hash_ids" is read as Mooncake's, 512 tokens per id,
and "ids=none" leaves it out).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from andante.workload._csv import read_columns

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's hash_ids name blocks of this many tokens
_JSONL_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """Which columns hold a trace's arrival time (None: none), prompt and output lengths;
    `unit` is the unit of a numeric time column."""

    name: str
    time: str | None
    prompt: str
    output: str
    unit: str = "s"
    about: str = ""  # which public traces use these columns
    prefix_ids: str | None = None  # optional column: a list of block content ids
    prefix_span: int = 0  # tokens per id of `prefix_ids`

    def __post_init__(self) -> None:
        if self.unit not in TIME_UNITS:
            raise ValueError(f"trace time unit {self.unit!r}: expected one of "
                             f"{', '.join(TIME_UNITS)}")
        if not (self.prompt and self.output and self.time != ""):
            raise ValueError(f"trace columns {self}: every column needs a name")

    def names(self, need_time: bool) -> tuple[str, ...]:
        if need_time:
            if self.time is None:
                raise ValueError(f"a {self.name} table has lengths only, no arrival times")
            return self.time, self.prompt, self.output
        return self.prompt, self.output


KNOWN_FORMATS: tuple[TraceColumns, ...] = (
    TraceColumns("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens",
                 about="Azure LLM inference 2023 and 2024, Splitwise"),
    TraceColumns("burstgpt", "Timestamp", "Request tokens", "Response tokens",
                 about="BurstGPT"),
    TraceColumns("mooncake", "timestamp", "input_length", "output_length", unit="ms",
                 about="Mooncake", prefix_ids="hash_ids", prefix_span=MOONCAKE_BLOCK_TOKENS),
    TraceColumns("vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens",
                 about="Vidur and Splitwise processed traces"),
    TraceColumns("sharegpt", None, "num_prefill_tokens", "num_decode_tokens",
                 about="ShareGPT lengths, no arrival times"),
)
MAPPING_FORM = "time=COL,prompt=COL,output=COL[,unit=s|ms|us|ns][,ids=COL|none[,span=N]]"
_MAPPING_KEYS = ("time", "prompt", "output", "unit", "ids", "span")


def parse_trace_columns(text: str) -> TraceColumns:
    """An explicit mapping "time=...,prompt=...,output=...,unit=ms" (unit optional)."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in _MAPPING_KEYS or not value:
            raise ValueError(f"trace columns {text!r}: bad item {item!r}; expected {MAPPING_FORM}")
        fields[key] = value
    missing = [key for key in ("time", "prompt", "output") if key not in fields]
    if missing:
        raise ValueError(f"trace columns {text!r}: missing {', '.join(missing)}; "
                         f"expected {MAPPING_FORM}")
    ids = fields.get("ids", "hash_ids")
    try:
        span = int(fields.get("span", MOONCAKE_BLOCK_TOKENS))
    except ValueError:
        span = 0
    if span < 1:
        raise ValueError(f"trace columns {text!r}: span must be a positive integer")
    return TraceColumns("custom", fields["time"], fields["prompt"], fields["output"],
                        fields.get("unit", "s"), prefix_ids=None if ids == "none" else ids,
                        prefix_span=span)


def is_jsonl(path: Path) -> bool:
    if path.suffix.lower() in _JSONL_SUFFIXES:
        return True
    with path.open("rb") as handle:
        return handle.read(64).lstrip().startswith(b"{")


def _jsonl_rows(path: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {line_number} is not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {line_number} is not a JSON object")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no data rows")
    return rows


def _header(path: Path) -> list[str]:
    if is_jsonl(path):
        with path.open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "{}")
        try:
            row = json.loads(first)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line 1 is not JSON ({exc})") from None
        return list(row) if isinstance(row, dict) else []
    with path.open(newline="", encoding="utf-8") as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def detect_columns(path: Path, need_time: bool) -> TraceColumns:
    """The first known format whose columns the file has; ValueError naming them if none."""
    header = set(_header(path))
    for columns in KNOWN_FORMATS:
        if (columns.time is not None or not need_time) and set(
            columns.names(need_time)) <= header:
            return columns
    known = "; ".join(f"{c.name}: {', '.join(c.names(c.time is not None))}"
                      for c in KNOWN_FORMATS)
    raise ValueError(f"{path}: columns {sorted(header)} match no known trace format ({known}); "
                     f"map them with --trace-columns {MAPPING_FORM}")


def _jsonl_columns(path: Path, names: tuple[str, ...]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {name: [] for name in names}
    for row_number, row in enumerate(_jsonl_rows(path), start=1):
        for name in names:
            if name not in row:
                raise ValueError(f"{path}: record {row_number} has no {name!r}")
            values[name].append(str(row[name]))
    return values


def read_trace_table(
    path: str | Path, columns: TraceColumns | None = None, need_time: bool = True
) -> tuple[TraceColumns, dict[str, list[str]]]:
    """The raw text of a trace's columns (recognised by name unless `columns` maps them),
    keyed by column name, with the columns used."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    try:
        chosen = columns or detect_columns(file, need_time)
        names = chosen.names(need_time)
        if is_jsonl(file):
            return chosen, _jsonl_columns(file, names)
        return chosen, read_columns(file, names)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read ({exc})") from exc


def _id_list(path: Path, row_number: int, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{path}: record {row_number}: block ids must be a list of "
                         f"integers, got {value!r}")
    return tuple(value)


def read_prefix_ids(path: str | Path, columns: TraceColumns) -> list[tuple[int, ...]] | None:
    """The block content ids of each record of a JSONL trace whose format has a column
    of them (Mooncake's hash_ids), in file order; None if it has none. A record without
    the column has no ids (an empty tuple)."""
    file = Path(path)
    if columns.prefix_ids is None or not is_jsonl(file):
        return None
    name = columns.prefix_ids
    try:
        rows = _jsonl_rows(file)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file}: cannot read ({exc})") from exc
    if not any(name in row for row in rows):
        return None
    return [_id_list(file, i, row[name]) if name in row else ()
            for i, row in enumerate(rows, start=1)]
