"""Stop strings: found in the detokenized text by the front end, never by the scheduler.

Design note (vLLM v1 checks stop strings in its front end's output processor, after
detokenizing, and aborts the request in the engine): the server's output processor
and offline generation (`andante.llm.generate`) search each request's newly decoded
text with `find_stop` after every step and finish the request (reason "stop"); the
text returned ends before the stop string. Only the tail that new characters could have
completed is searched, so the cost per token is constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from andante.core.request import Request
from andante.models.interface import IncrementalDecoder, Tokenizer


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the earliest stop string occurring in `text[start:]` begins, or None."""
    found = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(found) if found else None


def truncate_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` cut before the earliest stop string (unchanged if none occurs)."""
    cut = find_stop(text, stops)
    return text if cut is None else text[:cut]


@dataclass(slots=True)
class _Entry:
    decoder: IncrementalDecoder
    num_seen: int = 0


class StopStrings:
    """Incremental detokenizers for the requests with `SamplingParams.stop`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._entries: dict[str, _Entry] = {}

    def __call__(self, req: Request) -> bool:
        """Decode `req`'s new tokens; True if its text now contains a stop string."""
        stops = req.sampling.stop
        if not stops:
            return False
        entry = self._entries.get(req.request_id)
        if entry is None:
            entry = self._entries[req.request_id] = _Entry(self.tokenizer.incremental_decoder())
        outputs = req.output_token_ids
        num_new_chars = 0
        for token in outputs[entry.num_seen:]:
            num_new_chars += len(entry.decoder.push(token))
        entry.num_seen = len(outputs)
        if len(outputs) <= req.sampling.min_tokens:  # vLLM: stop strings only past it
            return False
        text = entry.decoder.text
        start = len(text) - num_new_chars - max(len(s) for s in stops) + 1
        return num_new_chars > 0 and find_stop(text, stops, max(0, start)) is not None
