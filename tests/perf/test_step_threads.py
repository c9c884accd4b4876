"""The compute threads each step ran on (andante's server records them in its step log):
read, reported per thread count by the fit, and a fit of one thread count's steps on
request (`calibrate --step-threads`)."""

from __future__ import annotations

import json

import pytest

from andante.perf.log_fit import LogFitRefused, fit_step_log
from andante.perf.step_log import StepLogError, parse_steps, step_record
from tests.perf.test_idle_wake import A100, DECODE, GAPS, LLAMA, _log


def _threaded(lines: list[str], threads_of) -> list[str]:
    out = []
    for line in lines:
        record = json.loads(line)
        out.append(json.dumps({**record, "threads": threads_of(record)}))
    return out


def test_steps_are_fitted_per_thread_count_on_request():
    lines = _threaded(_log(GAPS, 0.0, 1.0), lambda r: 1 if r["num_tokens"] < 8 else 2)
    steps = parse_steps(lines)
    assert {s.threads for s in steps} == {1, 2}
    fit = fit_step_log(steps, LLAMA, A100, "all")
    assert set(fit.by_threads) == {1, 2} and fit.num_other_threads == 0
    assert sum(k.num_steps for k in fit.by_threads.values()) == fit.num_steps
    with pytest.raises(LogFitRefused, match="decode-only steps|no decode steps"):
        fit_step_log(steps, LLAMA, A100, "two", threads=2)  # prompts alone: refused
    with pytest.raises(LogFitRefused, match=r"no step of the log ran on 4 thread\(s\) "
                       r"\(it has 1, 2\)"):
        fit_step_log(steps, LLAMA, A100, "four", threads=4)
    mixed = _threaded(_log(GAPS, 0.0, 1.0), lambda r: 1 + (r["t"] * 1000) % 2 // 1)
    kept = fit_step_log(parse_steps(mixed), LLAMA, A100, "one", threads=1)
    assert set(kept.by_threads) == {1} and kept.num_other_threads > 0
    assert "only steps on 1 thread(s)" in (kept.hardware.fitted_on or "")


def test_a_log_without_threads_cannot_be_chosen_by_them_and_bad_counts_are_refused():
    steps = parse_steps(_log(GAPS, 0.0, 1.0))
    with pytest.raises(LogFitRefused, match="do not record their compute threads"):
        fit_step_log(steps, LLAMA, A100, "x", threads=1)
    for bad in (0, -1, 1.5, "two"):
        line = json.dumps(step_record(DECODE, 0.01, 0, threads=bad))
        with pytest.raises(StepLogError, match="line 1: threads must be a positive"
                           if bad == 0 else "line 1: threads must be a non-negative"):
            parse_steps([line])
