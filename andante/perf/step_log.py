"""Read an engine's step log: each step's batch shape and its measured duration.

Design note. A step log is JSON lines; the lines that matter have `"kind": "step"` (any
other kind, such as the request and gc records of `andante serve --trace-steps` or a
setup header, is skipped, as is any field this reader does not know: an `engine` field
naming the source, timestamps, ids). Three engines write it: andante's server
(`andante serve --trace-steps`, andante.runtime.step_trace), vLLM running andante's
scheduler class (`{"andante": {"step_log": PATH}}`) and the GPU step benchmark
(benchmarks/gpu_steps.py). A step's fields, in seconds and token counts:

- `duration` (required): the step's measured time (vLLM's scheduler class: the engine
  core's whole cycle; andante's server: the forward pass, its `overhead` aside);
- `overhead`: andante's server, the wall time between the previous step's end and this
  step's start (scheduling, updating, streaming, taking requests in; null after the
  engine ran dry). A served request pays it between its tokens, so a step's cost is
  `duration + overhead` (issue 32 item 5: a fit of the forward passes alone predicted
  served TPOT 21-34% low);
- `num_tokens` (required): tokens the step advanced, summed over its sequences;
- `num_decode_seqs`: sequences advancing by one token after their prompt (0 if absent);
- `num_prefill_tokens`: the other sequences' tokens (prompt chunks, recomputation);
  `num_tokens - num_decode_seqs` if absent, and must equal it if present;
- `num_context_tokens`: tokens already in the KV cache of the step's sequences before it
  ran, summed (0 if absent);
- `num_seqs`, `num_sampled` (sequences that produce a token): if absent, the decodes plus
  one sequence per step with prefill tokens;
- `attn_pairs`, `kv_tokens_read`: the attention's query-key pairs (KunServe eq. (1), as
  andante.perf.shape counts them) and the KV tokens it reads. A log that has them gives
  the exact shape. Without them they are derived: kv_tokens_read = context + tokens,
  and the pairs as if every prefill sequence started from an empty cache with an equal
  share of the prefill tokens and the decodes held all the context (exact for steps of
  decodes alone and for one whole prompt; an estimate for mixed and chunked steps);
- `graph`: false where the engine launched the step op by op instead of replaying a CUDA
  graph (the GPU step benchmark's prefills): such steps can sit on a launch floor
  (andante.perf.log_fit);
- `t`: when the step ended, in seconds on the writer's clock (both servers write it).
  The reader derives each step's `idle_before`, the seconds the engine ran no step
  before it: its start (`t` - duration - overhead) less the previous step's `t`, about
  0 for a step that follows another at once (andante.perf.idle_wake fits what a step
  after an idle engine costs more). None for the first step, without `t`, or where
  `t` goes back (another process appended to the log);
- `threads`: the compute threads the step ran on (andante's server with a torch
  executor, which changes them per step size and while it serves): `calibrate
  --step-threads N` fits only the steps run on N, and the fit reports its error per
  thread count.

A malformed line, a step without a required field, or a shape that contradicts itself
is a `StepLogError` naming the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andante.perf.shape import BatchShape

STEP_KIND = "step"
REQUIRED_FIELDS = ("duration", "num_tokens")


class StepLogError(ValueError):
    """A step log that cannot be read as one."""


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """One step of a log: its shape, measured seconds, and where it came from."""

    shape: BatchShape
    duration: float
    line: int
    engine: str | None = None
    graph: bool | None = None  # False: launched op by op; None: the log does not say
    exact_shape: bool = True  # False: attention pairs derived from aggregates
    idle_before: float | None = None  # seconds without a step before it (module note)
    threads: int | None = None  # compute threads it ran on, where the log says

    @property
    def kind(self) -> str:
        """"decode" (decodes alone), "prefill" (no decode) or "mixed"."""
        if self.shape.num_decode_seqs == self.shape.num_seqs:
            return "decode"
        return "prefill" if self.shape.num_decode_seqs == 0 else "mixed"

    @property
    def has_prefill(self) -> bool:
        return self.shape.num_decode_seqs < self.shape.num_seqs


def _count(record: dict[str, Any], name: str, line: int, default: int | None = None) -> int:
    value = record.get(name, default)
    if value is None:
        raise StepLogError(f"line {line}: a step lacks {name!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StepLogError(f"line {line}: {name} must be a non-negative integer, "
                           f"got {value!r}")
    return value


def _duration(record: dict[str, Any], line: int) -> float:
    value = record.get("duration")
    if value is None:
        raise StepLogError(f"line {line}: a step lacks 'duration' (its measured seconds)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise StepLogError(f"line {line}: duration must be a positive number of seconds, "
                           f"got {value!r}")
    return float(value)


def _overhead(record: dict[str, Any], line: int) -> float:
    """The step's `overhead` seconds (0 if absent, null or negative: a clock's jitter)."""
    value = record.get("overhead")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise StepLogError(f"line {line}: overhead must be a number of seconds or null, "
                           f"got {value!r}")
    return max(0.0, float(value))


def step_shape(record: dict[str, Any], line: int) -> tuple[BatchShape, bool]:
    """(the step's shape, whether it is exact) from one step record; see the module note."""
    num_tokens = _count(record, "num_tokens", line)
    if num_tokens == 0:
        raise StepLogError(f"line {line}: a step of 0 tokens (num_tokens) is no step")
    decodes = _count(record, "num_decode_seqs", line, 0)
    prefill = _count(record, "num_prefill_tokens", line, max(0, num_tokens - decodes))
    if prefill + decodes != num_tokens:
        raise StepLogError(f"line {line}: num_prefill_tokens ({prefill}) + num_decode_seqs "
                           f"({decodes}) != num_tokens ({num_tokens})")
    context = _count(record, "num_context_tokens", line, 0)
    num_seqs = _count(record, "num_seqs", line, decodes + (1 if prefill else 0))
    if num_seqs < decodes + (1 if prefill else 0) or num_seqs > num_tokens:
        raise StepLogError(f"line {line}: num_seqs={num_seqs} does not fit {decodes} decodes "
                           f"and {prefill} prefill tokens")
    sampled = _count(record, "num_sampled", line, num_seqs)
    exact = "attn_pairs" in record and "kv_tokens_read" in record
    if exact:
        pairs = record["attn_pairs"]
        if isinstance(pairs, bool) or not isinstance(pairs, (int, float)) or pairs < 0:
            raise StepLogError(f"line {line}: attn_pairs must be a non-negative number, "
                               f"got {pairs!r}")
        kv_read = _count(record, "kv_tokens_read", line)
    else:
        prefill_seqs = num_seqs - decodes
        chunk = prefill / prefill_seqs if prefill_seqs else 0.0
        pairs = context + decodes + prefill_seqs * (chunk * chunk + chunk) * 0.5
        kv_read = context + num_tokens
    shape = BatchShape(num_seqs=num_seqs, num_tokens=num_tokens, num_sampled=sampled,
                       num_decode_seqs=decodes, attn_pairs=float(pairs),
                       kv_tokens_read=kv_read)
    return shape, exact


def _ended(record: dict[str, Any]) -> float | None:
    """The step's `t` (when it ended), None if absent or not a finite number."""
    value = record.get("t")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return None
    return float(value)


def _threads(record: dict[str, Any], line: int) -> int | None:
    """The step's `threads` (None if absent); StepLogError unless a positive integer."""
    if record.get("threads") is None:
        return None
    value = _count(record, "threads", line)
    if value == 0:
        raise StepLogError(f"line {line}: threads must be a positive integer, got 0")
    return value


def _idle_before(ended: float | None, duration: float, previous_end: float | None
                 ) -> float | None:
    """Seconds between the previous step's end and this step's start (`duration`: the
    step's own, overhead included); None where unknown or where the clock went back."""
    if ended is None or previous_end is None or ended < previous_end:
        return None
    return max(0.0, ended - duration - previous_end)


def parse_steps(lines: Iterable[str]) -> list[LoggedStep]:
    """The step records of a log's lines, in order (other kinds skipped)."""
    steps: list[LoggedStep] = []
    previous_end: float | None = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StepLogError(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise StepLogError(f"line {number}: expected a JSON object, got {text.strip()!r}")
        if record.get("kind") != STEP_KIND:
            continue
        shape, exact = step_shape(record, number)
        engine = record.get("engine")
        graph = record.get("graph")
        duration = _duration(record, number) + _overhead(record, number)
        ended = _ended(record)
        steps.append(LoggedStep(shape, duration, number,
                                str(engine) if engine is not None else None,
                                bool(graph) if graph is not None else None, exact,
                                _idle_before(ended, duration, previous_end),
                                _threads(record, number)))
        previous_end = ended
    return steps


def read_step_log(path: str | Path) -> list[LoggedStep]:
    """The steps of the log file `path`; StepLogError if it is unreadable or malformed."""
    try:
        with open(path, encoding="utf-8") as log:
            return parse_steps(log)
    except OSError as exc:
        raise StepLogError(f"cannot read step log {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise StepLogError(f"step log {path} is not UTF-8 text") from None


def step_record(shape: BatchShape, duration: float, num_context_tokens: int,
                **extra: Any) -> dict[str, Any]:
    """The step record of one step, as every writer of the log writes it (`extra`: the
    writer's own fields, e.g. engine, t, graph)."""
    return {"kind": STEP_KIND, "duration": duration, "num_seqs": shape.num_seqs,
            "num_tokens": shape.num_tokens,
            "num_prefill_tokens": shape.num_tokens - shape.num_decode_seqs,
            "num_decode_seqs": shape.num_decode_seqs,
            "num_context_tokens": num_context_tokens, "num_sampled": shape.num_sampled,
            "attn_pairs": shape.attn_pairs, "kv_tokens_read": shape.kv_tokens_read,
            **extra}
