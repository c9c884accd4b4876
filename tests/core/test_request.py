"""`Request`: every transition checks the previous state; the output has one mutator."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from andante.core import Request, RequestStatus, SamplingParams


def _request() -> Request:
    return Request("r", [1, 2, 3], SamplingParams(max_tokens=8), arrival_time=0.0)


def _running() -> Request:
    req = _request()
    req.start_running(1.0)
    return req


def _swapped() -> Request:
    req = _running()
    req.swap_out(2.0)
    return req


def _preempted() -> Request:
    req = _running()
    req.preempt_by_recompute(2.0)
    return req


def _finished() -> Request:
    req = _running()
    req.finish(RequestStatus.FINISHED_STOPPED, 3.0)
    return req


_ILLEGAL: list[tuple[str, Callable[[], Request], Callable[[Request], None]]] = [
    ("start a running request", _running, lambda r: r.start_running(2.0)),
    ("start a swapped request", _swapped, lambda r: r.start_running(3.0)),
    ("start a finished request", _finished, lambda r: r.start_running(4.0)),
    ("swap out a waiting request", _request, lambda r: r.swap_out(1.0)),
    ("swap out a swapped request", _swapped, lambda r: r.swap_out(3.0)),
    ("swap out a preempted request", _preempted, lambda r: r.swap_out(3.0)),
    ("swap in a running request", _running, lambda r: r.swap_in()),
    ("swap in a waiting request", _request, lambda r: r.swap_in()),
    ("preempt a waiting request", _request, lambda r: r.preempt_by_recompute(1.0)),
    ("preempt a preempted request", _preempted, lambda r: r.preempt_by_recompute(3.0)),
    ("preempt a finished request", _finished, lambda r: r.preempt_by_recompute(4.0)),
    ("finish a finished request", _finished,
     lambda r: r.finish(RequestStatus.FINISHED_ABORTED, 4.0)),
]


@pytest.mark.parametrize(("name", "make", "transition"), _ILLEGAL, ids=[i[0] for i in _ILLEGAL])
def test_illegal_transitions_raise_and_change_nothing(
    name: str, make: Callable[[], Request], transition: Callable[[Request], None]
) -> None:
    req = make()
    before = (req.status, req.num_computed_tokens, list(req.timeline.preemption_times),
              req.timeline.finish_time)
    with pytest.raises(RuntimeError, match=req.status.name):
        transition(req)
    after = (req.status, req.num_computed_tokens, list(req.timeline.preemption_times),
             req.timeline.finish_time)
    assert after == before


def test_finish_needs_a_finished_status() -> None:
    req = _running()
    with pytest.raises(ValueError, match="RUNNING"):
        req.finish(RequestStatus.RUNNING, 2.0)
    assert req.status == RequestStatus.RUNNING and req.timeline.finish_time is None


def test_legal_lifecycle_records_the_timeline() -> None:
    req = _running()
    req.num_computed_tokens = 3
    req.swap_out(2.0)
    req.swap_in()
    req.preempt_by_recompute(3.0)
    assert req.num_computed_tokens == 0
    req.start_running(4.0)
    req.finish(RequestStatus.FINISHED_LENGTH, 5.0)
    timeline = req.timeline
    assert (timeline.first_scheduled_time, timeline.finish_time) == (1.0, 5.0)
    assert timeline.preemption_times == [2.0, 3.0]
    assert (timeline.num_swaps_out, timeline.num_recomputes) == (1, 1)
    assert req.finish_reason == "length"


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        Request("e", [], SamplingParams(), 0.0)


def test_output_token_ids_are_read_only() -> None:
    req = _running()
    req.append_output_token(7, 1.5)
    view = req.output_token_ids
    with pytest.raises(AttributeError):
        view.append(8)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        view[0] = 8  # type: ignore[index]
    with pytest.raises(AttributeError):
        req.output_token_ids = [8]  # type: ignore[misc]
    assert view == [7] and req.num_output_tokens == 1


def test_append_output_token_records_one_token_per_time() -> None:
    req = _running()
    req.append_output_token(5, 1.0)
    req.append_output_token(6, 2.0, 2.5, 3.0)
    assert req.output_token_ids == [5, 6, 6, 6]
    assert req.timeline.token_times == [1.0, 2.0, 2.5, 3.0]
    assert req.num_tokens == 7 and req.num_remaining_output_tokens == 4


def test_a_pickled_request_keeps_its_output_view() -> None:  # Ray ships requests
    req = _running()
    req.append_output_token(5, 1.0)
    copy = pickle.loads(pickle.dumps(req))
    copy.append_output_token(6, 2.0)
    assert copy.output_token_ids == [5, 6] and req.output_token_ids == [5]
