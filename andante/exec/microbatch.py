"""A pipeline group's step cut into microbatches: the plan's types and helpers
(torch-free; the threads that run them: andante.exec.torch_microbatch, whose module note
says how).

A microbatch is a list of `Piece`s: rows of the step, or a prefill chunk cut in two (its
first piece covers positions [prefix, prefix + tokens), the second the rest; only the
piece that ends the row samples). A `MicrobatchPlanner` decides them (KunServe's
lookahead: andante.cluster.kunserve.lookahead's `lookahead_planner`; `by_rows` cuts the
rows into runs of equal count).

Per-microbatch completion (both clocks: andante.sim.pipeline, andante.engine.overlap).
A microbatch completes the rows whose last piece it holds (`completion_rows`): those that
sample get their token when it leaves the last stage; those that sample nothing (a
prompt's inner chunk) are applied when it leaves stage 0, since their next chunk needs
no token, only to follow this one through every stage (each stage takes microbatches in
order). A step formed while `j` microbatches are in flight fills `free_slots`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from andante.exec.batch import StepBatch, StepResult


@dataclass(frozen=True, slots=True)
class Piece:
    """`tokens` new tokens of step row `row`, after `prefix` cached ones."""

    row: int
    prefix: int
    tokens: int


MicrobatchPlanner = Callable[[StepBatch, int], list[list[Piece]]]


@dataclass(frozen=True, slots=True)
class RowsDone:
    """A microbatch's completing rows: `sampling` once it leaves the last stage,
    `ordered` (inner prompt chunks) once it leaves stage 0 (module note)."""

    sampling: tuple[int, ...]
    ordered: tuple[int, ...]


@dataclass(slots=True)
class PipelineEvent:
    """A microbatch left stage 0 (`last_stage` False) or the last stage, completing the
    step rows in `batch` (whole rows, possibly none) with `result`."""

    batch: StepBatch
    result: StepResult
    last_stage: bool


def free_slots(num_stages: int, in_flight: int) -> int:
    """Microbatches a step formed now may hold: one per stage not already holding one
    (at least one: a step is formed only when stage 0 is free)."""
    return max(1, num_stages - in_flight)


def by_rows(batch: StepBatch, num_stages: int) -> list[list[Piece]]:
    """Rows in `num_stages` contiguous runs of (nearly) equal count, none cut."""
    rows = [Piece(i, c, n) for i, (c, n) in enumerate(
        zip(batch.num_cached_tokens, batch.num_new_tokens, strict=True))]
    count = min(num_stages, len(rows))
    if count <= 1:
        return [rows] if rows else []
    size, extra = divmod(len(rows), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (1 if k < extra else 0)
        out.append(rows[start:end])
        start = end
    return out


def check_plan(batch: StepBatch, plan: Sequence[Sequence[Piece]]) -> None:
    """Each row's pieces, in microbatch order, cover exactly its step tokens."""
    cursor = list(batch.num_cached_tokens)
    for micro in plan:
        for piece in micro:
            if piece.prefix != cursor[piece.row] or piece.tokens < 1:
                raise ValueError(f"microbatch plan: piece {piece} does not continue row "
                                 f"{piece.row} at position {cursor[piece.row]}")
            cursor[piece.row] += piece.tokens
    ends = [c + n for c, n in zip(batch.num_cached_tokens, batch.num_new_tokens, strict=True)]
    if cursor != ends:
        raise ValueError("microbatch plan: some rows' tokens are not covered")


def completion_rows(batch: StepBatch, plan: Sequence[Sequence[Piece]]) -> list[RowsDone]:
    """For each microbatch, the step rows whose last piece it holds, split by whether
    they sample (module note)."""
    ends = [c + n for c, n in zip(batch.num_cached_tokens, batch.num_new_tokens, strict=True)]
    out = []
    for micro in plan:
        rows = [p.row for p in micro if p.prefix + p.tokens == ends[p.row]]
        out.append(RowsDone(tuple(r for r in rows if batch.samples[r]),
                            tuple(r for r in rows if not batch.samples[r])))
    return out


def rows_step(batch: StepBatch, tokens: Sequence[int | None], rows: Sequence[int],
              seconds: float, first: bool, swap_time: float = 0.0
              ) -> tuple[StepBatch, StepResult]:
    """The step restricted to `rows` (whole rows, with their sampled `tokens`, aligned
    with the step), as the engine applies it when they complete; the step's swaps and
    releases (and `swap_time`) go with its `first` part."""
    sub = StepBatch()
    if first:
        sub.swap_out, sub.swap_in = batch.swap_out, batch.swap_in
        sub.released_ids = batch.released_ids
    for row in rows:
        sub.add(batch.requests[row], batch.num_new_tokens[row], batch.num_cached_tokens[row],
                batch.samples[row], batch.block_tables[row])
    return sub, StepResult([tokens[row] for row in rows], seconds,
                           swap_time if first else 0.0)


def sub_batch(batch: StepBatch, pieces: Sequence[Piece]) -> tuple[StepBatch, list[int]]:
    """The step batch of one microbatch, and the step row of each of its rows."""
    sub = StepBatch()
    for piece in pieces:
        row = piece.row
        ends_row = piece.prefix + piece.tokens == (
            batch.num_cached_tokens[row] + batch.num_new_tokens[row])
        sub.add(batch.requests[row], piece.tokens, piece.prefix,
                batch.samples[row] and ends_row, batch.block_tables[row])
    return sub, [p.row for p in pieces]
