"""A served engine's step and request trace (`andante serve --trace-steps FILE`).

Design note: a debugging record of where a request's time to first token goes on the
real server, one JSON object per line. It is an engine observer (the engine's observer
seam, DESIGN.md §2.6) plus a hook the front end calls when the engine takes a request
in, so it sees every step and every request without touching the scheduler:

- `{"kind": "step", ...}` per engine step: when it ended (`t`, the server's clock),
  the executor's measured `duration`, `overhead` (the wall time since the previous step
  ended less `duration`: scheduling, updating, streaming, taking requests in; None for
  the first step after the engine ran dry, whose wait for work is no overhead),
  `num_seqs`, `num_tokens`, the ids given more than one token (`prefill_ids`: a
  prompt chunk, or a recomputation) and the queue left (`num_waiting`); and the step's
  shape as a step log has it (andante.perf.step_log, what `andante calibrate
  --step-log` fits): `num_prefill_tokens`, `num_decode_seqs`, `num_context_tokens`,
  `num_sampled`, `attn_pairs`, `kv_tokens_read`, and `engine` ("andante"); `threads`,
  where the server gives the trace a reader of them (a torch executor: the intra-op
  threads the step ran on, which the executor sets per step size and adapts while it
  serves, andante.exec.thread_adapter; read in the stepping thread, right after it).
- `{"kind": "request", ...}` per finished request: its arrival at the server, when the
  engine took it in (`seen`), first scheduled, first token, finish; the derived waits
  (`to_engine` = seen - arrival, `queue` = first scheduled - seen, `prefill` = first
  token - first scheduled), whether the engine was idle when it took the request in
  (`idle`: else it took it in at the end of a step), the steps that carried its prompt
  and the overhead of those steps, and its preemptions; `origin`, the wall time of the
  clock's zero, so that
  andante.perf.frontend_log can set them beside the HTTP timing middleware's records
  (andante.server.http_timing, which `--trace-steps` installs on the same file).
- `{"kind": "gc", ...}` (with `watch_gc`) per pause of the garbage collector in the
  process: every full collection, younger ones from 1 ms.

Records go to a text stream opened by the caller (the server opens its file
line-buffered, so a stopped server's trace is complete).
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from andante.core.clock import Clock
from andante.core.request import Request
from andante.engine.engine import StepOutput
from andante.engine.stats import SchedulerStats
from andante.perf.step_log import step_record

GC_REPORT_S = 0.001  # younger collections are recorded from this pause up
ENGINE = "andante"  # the step records' source (andante.perf.step_log's engine field)


@dataclass(slots=True)
class _Pending:
    """What the trace knows of a request not finished yet."""

    seen: float
    idle: bool  # the engine was waiting for work (no step between arrival and seen)
    prefill_steps: int = 0
    prefill_overhead: float = 0.0


@dataclass(slots=True)
class StepTrace:
    """Observer of one engine (`engine.add_observer(trace)`); `seen(req)` from the
    thread that steps the engine, when the engine takes `req` in."""

    out: TextIO
    clock: Clock
    threads: Callable[[], int] | None = None  # the stepping thread's compute threads now
    _last_end: float | None = None
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _gc_started: float | None = None

    def seen(self, req: Request) -> None:
        self._pending[req.request_id] = _Pending(self.clock.now(), self._last_end is None)

    def watch_gc(self) -> None:
        """Also record the garbage collector's pauses in this process (`kind` "gc"):
        every full collection, and younger ones that took 1 ms or more."""
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = self.clock.now()
        if phase == "start":
            self._gc_started = now
            return
        if self._gc_started is None:
            return
        pause, self._gc_started = now - self._gc_started, None
        if info["generation"] == 2 or pause >= GC_REPORT_S:
            self._write({"kind": "gc", "t": now, "generation": info["generation"],
                         "pause": pause, "collected": info["collected"]})

    def __call__(self, output: StepOutput, stats: SchedulerStats) -> None:
        batch, now = output.batch, stats.time
        if batch.is_empty:
            self._finish_all(output.finished)
            return
        duration = output.result.duration
        overhead = None if self._last_end is None else now - self._last_end - duration
        busy = stats.num_running + stats.num_waiting + stats.num_swapped > 0
        self._last_end = now if busy else None  # idle next: its wait is no overhead
        pairs = zip(batch.requests, batch.num_new_tokens, strict=True)
        prefill_ids = [req.request_id for req, n in pairs if n > 1]
        for rid in prefill_ids:
            pending = self._pending.get(rid)
            if pending is not None:
                pending.prefill_steps += 1
                pending.prefill_overhead += overhead or 0.0
        self._write({**step_record(batch.shape(), duration, sum(batch.num_cached_tokens),
                                   engine=ENGINE),
                     "t": now, "overhead": overhead, "prefill_ids": prefill_ids,
                     **({"threads": self.threads()} if self.threads is not None else {}),
                     "num_waiting": stats.num_waiting})
        self._finish_all(output.finished)

    def _finish_all(self, finished: list[Request]) -> None:
        if not finished:
            return
        origin = time.time() - self.clock.now()  # the clock's zero on the wall clock
        for req in finished:
            record = self._request_record(req, self._pending.pop(req.request_id, None))
            self._write({**record, "origin": origin})

    @staticmethod
    def _request_record(req: Request, pending: _Pending | None) -> dict[str, Any]:
        tl = req.timeline
        first_token = tl.token_times[0] if tl.token_times else None
        seen = pending.seen if pending is not None else None

        def minus(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a - b

        return {"kind": "request", "id": req.request_id, "prompt": req.num_prompt_tokens,
                "output": req.num_output_tokens, "arrival": req.arrival_time, "seen": seen,
                "first_scheduled": tl.first_scheduled_time, "first_token": first_token,
                "finish": tl.finish_time, "ttft": minus(first_token, req.arrival_time),
                "to_engine": minus(seen, req.arrival_time),
                "queue": minus(tl.first_scheduled_time, seen),
                "prefill": minus(first_token, tl.first_scheduled_time),
                "idle": pending.idle if pending else None,
                "prefill_steps": pending.prefill_steps if pending else None,
                "prefill_overhead": pending.prefill_overhead if pending else None,
                "num_preemptions": len(tl.preemption_times)}

    def _write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
