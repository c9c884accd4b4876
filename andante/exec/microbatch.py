"""A pipeline group's step cut into microbatches: the plan's types and helpers
(torch-free; the threads that run them: andante.exec.torch_microbatch, whose module note
says how).

A microbatch is a list of `Piece`s: rows of the step, or a prefill chunk cut in two (its
first piece covers positions [prefix, prefix + tokens), the second the rest; only the
piece that ends the row samples). A `MicrobatchPlanner` decides them (KunServe's
lookahead: andante.cluster.kunserve.lookahead's `lookahead_planner`; `by_rows` cuts the
rows into runs of equal count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from andante.exec.batch import StepBatch


@dataclass(frozen=True, slots=True)
class Piece:
    """`tokens` new tokens of step row `row`, after `prefix` cached ones."""

    row: int
    prefix: int
    tokens: int


MicrobatchPlanner = Callable[[StepBatch, int], list[list[Piece]]]


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


def completing_rows(batch: StepBatch, plan: Sequence[Sequence[Piece]]
                    ) -> list[tuple[int, ...]]:
    """For each microbatch, the step rows whose last piece it holds: their requests have
    their step's tokens once it leaves the last stage (per-microbatch completion)."""
    ends = [c + n for c, n in zip(batch.num_cached_tokens, batch.num_new_tokens, strict=True)]
    return [tuple(p.row for p in micro if p.prefix + p.tokens == ends[p.row])
            for micro in plan]


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
