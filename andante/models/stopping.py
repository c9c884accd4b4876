"""Stop strings: the engine's `StopChecker` hook, backed by incremental detokenization.

The scheduler calls the checker after every new token (andante.engine.stopping). Only
requests with `sampling.stop` get a decoder; each call pushes the tokens it has not seen
and searches the freshly extended tail of the text, so the cost per token is constant.
Entries of requests that finished for another reason are swept periodically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from andante.core.request import Request
from andante.models.interface import IncrementalDecoder, Tokenizer

SWEEP_EVERY = 256


@dataclass(slots=True)
class _Entry:
    request: Request
    decoder: IncrementalDecoder
    num_seen: int = 0


def truncate_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` cut before the earliest stop string (unchanged if none occurs)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class StopStrings:
    """Implements `andante.engine.stopping.StopChecker` for `SamplingParams.stop`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._entries: dict[str, _Entry] = {}
        self._num_calls = 0

    def __call__(self, req: Request) -> bool:
        stops = req.sampling.stop
        if not stops:
            return False
        self._num_calls += 1
        if self._num_calls % SWEEP_EVERY == 0:
            self._sweep()
        entry = self._entries.get(req.request_id)
        if entry is None:
            entry = _Entry(req, self.tokenizer.incremental_decoder())
            self._entries[req.request_id] = entry
        outputs = req.output_token_ids
        num_new_chars = 0
        for token in outputs[entry.num_seen:]:
            num_new_chars += len(entry.decoder.push(token))
        entry.num_seen = len(outputs)
        if num_new_chars == 0:
            return False
        tail = entry.decoder.text[-(num_new_chars + max(len(s) for s in stops) - 1):]
        if any(s and s in tail for s in stops):
            del self._entries[req.request_id]
            return True
        return False

    def _sweep(self) -> None:
        done = [rid for rid, e in self._entries.items() if e.request.is_finished]
        for rid in done:
            del self._entries[rid]

    @property
    def num_tracked(self) -> int:
        return len(self._entries)
