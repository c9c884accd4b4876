"""Engine-thread output processing: incremental detokenization, stop strings, deltas.

After each step (in the engine thread) `stopped()` detokenizes the new tokens once and
names the requests whose text reached a stop string, which the engine then finishes
(`Engine.finish_stopped`); `deltas()` turns the step's updated and
finished requests into `Delta`s: the text completed since the last delta (text that
might still turn into a stop string is held back; a matched stop string and what
follows it are never sent) and, at the end, a snapshot record for the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andante.core.request import Request
from andante.engine.engine import StepOutput
from andante.metrics import RequestRecord
from andante.models.interface import IncrementalDecoder
from andante.models.stopping import find_stop


@dataclass(slots=True, frozen=True)
class Delta:
    """What one step produced for one request (one hand-off item)."""

    request_id: str
    text: str
    num_new_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None
    record: RequestRecord | None = None  # set when finished
    queue_time: float | None = None  # set when finished and it was ever scheduled


@dataclass(slots=True)
class _TextState:
    decoder: IncrementalDecoder
    stop: tuple[str, ...]
    hold: int  # characters held back while a stop string could still be forming
    num_sent_chars: int = 0
    num_sent_tokens: int = 0
    stop_at: int | None = None  # index of a matched stop string in decoder.text
    num_seen_tokens: int = field(default=0)


class OutputProcessor:
    """Per-request detokenizers, keyed by request id.

    `register` may be called from any thread before the request is submitted (a single
    dict store); everything else runs in the engine thread.
    """

    def __init__(self) -> None:
        self._states: dict[str, _TextState] = {}

    def register(self, request_id: str, decoder: IncrementalDecoder, stop: tuple[str, ...]) -> None:
        hold = max((len(s) for s in stop), default=1) - 1
        self._states[request_id] = _TextState(decoder, stop, hold)

    def discard(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def resume(self, req: Request) -> None:
        """A registered request that already streamed its output so far (elsewhere, or
        before a model swap): its next delta starts after what was sent."""
        state = self._states[req.request_id]
        self._catch_up(req, state)
        state.num_sent_tokens = req.num_output_tokens
        text = state.decoder.text
        state.num_sent_chars = max(0, len(text) - state.hold) if state.stop else len(text)

    def stopped(self, out: StepOutput) -> list[str]:
        """Ids of the step's unfinished requests whose text now contains a stop string."""
        return [r.request_id for r in out.updated if not r.is_finished and self._stops(r)]

    def _stops(self, req: Request) -> bool:
        state = self._states.get(req.request_id)
        if state is None:
            return False
        self._catch_up(req, state)
        if not state.stop or req.num_output_tokens <= req.sampling.min_tokens:
            return False  # vLLM checks stop strings only past min_tokens
        start = max(0, state.num_sent_chars - state.hold - 1)
        state.stop_at = find_stop(state.decoder.text, state.stop, start)
        return state.stop_at is not None

    @staticmethod
    def _catch_up(req: Request, state: _TextState) -> None:
        tokens = req.output_token_ids
        for token in tokens[state.num_seen_tokens :]:
            state.decoder.push(token)
        state.num_seen_tokens = len(tokens)

    def deltas(self, out: StepOutput) -> list[Delta]:
        """One delta per request that got a token or finished in this step."""
        finished = {id(r) for r in out.finished}
        deltas = [self._delta(r, id(r) in finished) for r in out.updated]
        updated = {id(r) for r in out.updated}
        deltas += [self._delta(r, True) for r in out.finished if id(r) not in updated]
        return deltas

    def _delta(self, req: Request, is_finished: bool) -> Delta:
        rid = req.request_id
        state = self._states.get(rid)
        text = ""
        num_new = req.num_output_tokens
        if state is not None:
            text = self._new_text(req, state, is_finished)
            num_new = req.num_output_tokens - state.num_sent_tokens
            state.num_sent_tokens = req.num_output_tokens
        if not is_finished:
            return Delta(rid, text, num_new, req.num_output_tokens)
        self._states.pop(rid, None)
        first = req.timeline.first_scheduled_time
        queue = None if first is None else first - req.arrival_time
        return Delta(
            rid, text, num_new, req.num_output_tokens, req.finish_reason,
            RequestRecord.from_request(req), queue,
        )

    def _new_text(self, req: Request, state: _TextState, is_finished: bool) -> str:
        self._catch_up(req, state)
        text = state.decoder.text
        if state.stop_at is not None:
            end = state.stop_at
        elif is_finished or not state.stop:
            end = len(text)
        else:
            end = max(state.num_sent_chars, len(text) - state.hold)
        piece = text[state.num_sent_chars : end]
        state.num_sent_chars = max(state.num_sent_chars, end)
        return piece
