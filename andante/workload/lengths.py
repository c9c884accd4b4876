"""Prompt and output length samplers: each returns `(prompt_lens, output_lens)` int64 arrays.

Files are read only when a sampler is given a path. Empirical samplers draw rows i.i.d.
(with replacement) from the file, so any `num` works and the sample's distribution is
the file's; a prompt and its output always come from the same row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from andante.workload._csv import read_columns, to_int_array
from andante.workload.formats import TraceColumns, read_trace_table

Lengths = tuple[np.ndarray, np.ndarray]

SHAREGPT_PROMPT_COLUMN = "num_prefill_tokens"
SHAREGPT_OUTPUT_COLUMN = "num_decode_tokens"


def _check_num(num: int) -> None:
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num!r}")


def fixed(prompt_len: int, output_len: int, num: int) -> Lengths:
    """Every request has the same lengths."""
    if prompt_len < 1 or output_len < 1:
        raise ValueError(f"fixed lengths must be >= 1, got {prompt_len}:{output_len}")
    _check_num(num)
    return np.full(num, prompt_len, dtype=np.int64), np.full(num, output_len, dtype=np.int64)


def uniform(
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    num: int,
    rng: np.random.Generator,
) -> Lengths:
    """Prompt and output lengths drawn independently and uniformly from inclusive ranges."""
    for name, (low, high) in (("prompt", prompt_range), ("output", output_range)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} range must satisfy 1 <= low <= high, got {low}..{high}")
    _check_num(num)
    prompts = rng.integers(prompt_range[0], prompt_range[1], size=num, endpoint=True)
    outputs = rng.integers(output_range[0], output_range[1], size=num, endpoint=True)
    return prompts.astype(np.int64), outputs.astype(np.int64)


def read_length_pairs(path: str | Path, prompt_column: str, output_column: str) -> Lengths:
    """All (prompt, output) rows of a CSV, in file order."""
    columns = read_columns(path, (prompt_column, output_column))
    prompts = to_int_array(path, prompt_column, columns[prompt_column])
    outputs = to_int_array(path, output_column, columns[output_column])
    return prompts, outputs


def sample_rows(
    prompts: np.ndarray,
    outputs: np.ndarray,
    num: int,
    rng: np.random.Generator,
    *,
    max_context: int | None = None,
    source: str = "lengths",
) -> Lengths:
    """Draw `num` rows i.i.d.; rows with an empty side or prompt + output > max_context
    are left out first."""
    _check_num(num)
    if max_context is not None and max_context < 2:
        raise ValueError(f"max_context must be >= 2, got {max_context!r}")
    keep = (prompts >= 1) & (outputs >= 1)
    if max_context is not None:
        keep &= prompts + outputs <= max_context
    if not np.any(keep):
        raise ValueError(f"{source}: no row fits (max_context={max_context})")
    rows = rng.integers(0, int(np.count_nonzero(keep)), size=num)
    return prompts[keep][rows], outputs[keep][rows]


def sharegpt(
    path: str | Path, num: int, rng: np.random.Generator, max_context: int | None = None
) -> Lengths:
    """Rows of the ShareGPT lengths CSV (num_prefill_tokens, num_decode_tokens)."""
    prompts, outputs = read_length_pairs(path, SHAREGPT_PROMPT_COLUMN, SHAREGPT_OUTPUT_COLUMN)
    return sample_rows(prompts, outputs, num, rng, max_context=max_context, source=str(path))


def from_trace(
    path: str | Path,
    num: int,
    rng: np.random.Generator,
    max_context: int | None = None,
    columns: TraceColumns | None = None,
) -> Lengths:
    """Rows of a trace in any format of `andante.workload.formats` (recognised by name
    unless `columns` maps them), arrivals ignored: the trace's length distribution under
    any arrival process."""
    used, table = read_trace_table(path, columns, need_time=False)
    prompts = to_int_array(path, used.prompt, table[used.prompt])
    outputs = to_int_array(path, used.output, table[used.output])
    return sample_rows(prompts, outputs, num, rng, max_context=max_context, source=str(path))
