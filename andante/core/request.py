"""The request: the single source of truth for one generation job.

Everything the scheduler, the executors and the metrics need about a request lives
here; derived values are properties. Status transitions are methods that check the
previous state, so an illegal transition is a bug that fails loudly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from andante.core.sampling import SLO, SamplingParams


class RequestStatus(IntEnum):
    """Ordered lifecycle: anything >= FINISHED_STOPPED is terminal."""

    WAITING = 0  # never run; holds no KV
    RUNNING = 1  # holds KV blocks on the device tier
    PREEMPTED = 2  # preempted by recompute; holds no KV, re-prefills on resume
    SWAPPED = 3  # preempted by swap; its KV blocks are on the host tier
    FINISHED_STOPPED = 4  # EOS, stop token or stop string
    FINISHED_LENGTH = 5  # max_tokens, max_model_len or KV capacity reached
    FINISHED_ABORTED = 6  # client went away or operator aborted
    FINISHED_REJECTED = 7  # refused before it ever ran (can never fit)

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


class PreemptionMode(IntEnum):
    RECOMPUTE = 0
    SWAP = 1


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_REJECTED: "rejected",
}


class SyntheticTokens(Sequence[int]):
    """A prompt of `length` copies of one token id, in O(1) memory (simulation)."""

    __slots__ = ("_length", "_token_id")

    def __init__(self, length: int, token_id: int = 0) -> None:
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        self._length = length
        self._token_id = token_id

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [self._token_id] * len(range(*index.indices(self._length)))
        if not -self._length <= index < self._length:
            raise IndexError(index)
        return self._token_id


class TokenIds(Sequence[int]):
    """A read-only view of a list of token ids (slices are copies)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        return self._ids[index]

    def __eq__(self, other: object) -> bool:  # (unhashable, as a list)
        return isinstance(other, Sequence) and self._ids == list(other)


@dataclass(frozen=True, slots=True)
class PrefixIds:
    """The content of a prompt without real token ids (simulation), for prefix caching.

    `ids[k]` names the content of tokens [k * span_tokens, (k + 1) * span_tokens): two
    requests whose first k ids are equal share their first k * span_tokens tokens (a
    trace's hash ids, or a workload generator's shared system prompt or conversation
    history). `num_tokens` (at most len(ids) * span_tokens) is how many tokens the ids
    describe; it may exceed the prompt (a conversation turn's answer, which the next
    turn's prompt repeats)."""

    ids: tuple[int, ...]
    span_tokens: int
    num_tokens: int

    def __post_init__(self) -> None:
        if self.span_tokens < 1:
            raise ValueError(f"span_tokens must be >= 1, got {self.span_tokens}")
        if not 0 <= self.num_tokens <= len(self.ids) * self.span_tokens:
            raise ValueError(f"num_tokens {self.num_tokens} outside [0, "
                             f"{len(self.ids) * self.span_tokens}] for {len(self.ids)} ids")


@dataclass(slots=True)
class Timeline:
    """What happened to a request, in clock seconds. Metrics are pure functions of it."""

    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    first_scheduled_time: float | None = None
    finish_time: float | None = None
    preemption_times: list[float] = field(default_factory=list)
    num_swaps_out: int = 0
    num_recomputes: int = 0
    rejection_reason: str | None = None  # why it was refused (FINISHED_REJECTED)
    # prefix caching, summed over the request's admissions (a recompute is one more):
    num_prefix_query_tokens: int = 0  # tokens looked up in the prefix cache
    num_prefix_hit_tokens: int = 0  # of them, found cached (prefill saved)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams
    arrival_time: float
    priority: int = 0
    model: str = ""
    slo: SLO = field(default_factory=SLO)
    prefix_ids: PrefixIds | None = None  # content ids of a synthetic prompt (simulation)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    timeline: Timeline = field(init=False)
    _num_prompt_tokens: int = field(init=False)
    _output_token_ids: list[int] = field(init=False, default_factory=list)
    _output_view: TokenIds = field(init=False)

    def __post_init__(self) -> None:
        self._num_prompt_tokens = len(self.prompt_token_ids)
        if self._num_prompt_tokens == 0:
            raise ValueError(f"request {self.request_id!r}: empty prompt")
        self.timeline = Timeline(arrival_time=self.arrival_time)
        self._output_view = TokenIds(self._output_token_ids)

    # ---- derived values -------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt_tokens

    @property
    def output_token_ids(self) -> TokenIds:
        """The generated tokens, read-only (`append_output_token` is the one mutator)."""
        return self._output_view

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what a full (re)prefill would compute."""
        return self._num_prompt_tokens + len(self._output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens known but not yet in the KV cache (1 while decoding)."""
        return self._num_prompt_tokens + len(self._output_token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    @property
    def num_remaining_output_tokens(self) -> int:
        return self.sampling.max_tokens - len(self._output_token_ids)

    # ---- transitions ----------------------------------------------------------------
    def _expect(self, *allowed: RequestStatus) -> None:
        if self.status not in allowed:
            names = "/".join(s.name for s in allowed)
            raise RuntimeError(
                f"request {self.request_id!r} is {self.status.name}, expected {names}"
            )

    def start_running(self, now: float) -> None:
        """WAITING or PREEMPTED -> RUNNING (KV blocks were just allocated)."""
        self._expect(RequestStatus.WAITING, RequestStatus.PREEMPTED)
        self.status = RequestStatus.RUNNING
        if self.timeline.first_scheduled_time is None:
            self.timeline.first_scheduled_time = now

    def preempt_by_recompute(self, now: float) -> None:
        """RUNNING or SWAPPED -> PREEMPTED: the KV is dropped and will be recomputed."""
        self._expect(RequestStatus.RUNNING, RequestStatus.SWAPPED)
        self.status = RequestStatus.PREEMPTED
        self.num_computed_tokens = 0
        self.timeline.preemption_times.append(now)
        self.timeline.num_recomputes += 1

    def swap_out(self, now: float) -> None:
        self._expect(RequestStatus.RUNNING)
        self.status = RequestStatus.SWAPPED
        self.timeline.preemption_times.append(now)
        self.timeline.num_swaps_out += 1

    def swap_in(self) -> None:
        self._expect(RequestStatus.SWAPPED)
        self.status = RequestStatus.RUNNING

    def finish(self, status: RequestStatus, now: float) -> None:
        if not status.is_finished:
            raise ValueError(f"{status.name} is not a finished status")
        if self.is_finished:
            raise RuntimeError(f"request {self.request_id!r} already {self.status.name}")
        self.status = status
        self.timeline.finish_time = now

    def reject(self, reason: str, now: float) -> None:
        """WAITING -> FINISHED_REJECTED: it can never be served here, for `reason`."""
        self.finish(RequestStatus.FINISHED_REJECTED, now)
        self.timeline.rejection_reason = reason

    def append_output_token(self, token_id: int, now: float, *later: float) -> None:
        """Record `token_id`, emitted at `now` (and once more at each of `later`: the
        simulator's decode runs). With `append_output_run`, the one place the output
        grows."""
        self._output_token_ids.append(token_id)
        self.timeline.token_times.append(now)
        if later:
            self.append_output_run(token_id, later)

    def append_output_run(self, token_id: int, times: Sequence[float]) -> None:
        """Record `token_id` emitted once at each of `times` (a simulator run's steps,
        its times passed as they are)."""
        self._output_token_ids += [token_id] * len(times)
        self.timeline.token_times += times
