"""The plain-Python QoE path for few streams (`qoe.qoe_wait_served_small`) equals the vectorized one
bit for bit, on random stream summaries, timelines and serving plans."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.policies.andes.qoe import (
    NO_LATENESS,
    SMALL_STREAMS,
    Streams,
    qoe_wait_served,
    qoe_wait_served_small,
)

_streams_of = st.lists(st.tuples(
    st.floats(0.0, 30.0), st.sampled_from([0.05, 0.1, 0.2, 1 / 3, 0.5]),
    st.integers(0, 60), st.one_of(st.just(NO_LATENESS), st.floats(-20.0, 20.0)),
    st.floats(0.0, 100.0), st.floats(0.0, 4.0)), min_size=1, max_size=SMALL_STREAMS)


def _vectorized(s: Streams, now: float, t: float, first: np.ndarray,
                tau: float) -> tuple[np.ndarray, np.ndarray]:
    """The numpy path: the streams padded past SMALL_STREAMS with copies of themselves."""
    reps = SMALL_STREAMS // len(s.n) + 1
    big = Streams(*(np.tile(a, reps) for a in (s.start, s.inv, s.n, s.late, s.pos)))
    q_wait, q_serve = qoe_wait_served(big, now, t, np.tile(first, reps), tau)
    return q_wait[: len(s.n)], q_serve[: len(s.n)]


@settings(max_examples=300, deadline=None)
@given(_streams_of, st.floats(0.0, 40.0), st.floats(0.0, 15.0),
       st.sampled_from([0.01, 0.02, 0.1, 0.2, 0.5, 1.0]))
def test_scalar_path_is_bit_identical(rows: list, now: float, horizon: float,
                                      tau: float) -> None:
    start, inv, n, late, pos, first = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    s = Streams(start, inv, n, late, pos)
    t = now + horizon
    small = qoe_wait_served_small(start, inv, n, late, pos, now, t, first, tau)
    big = _vectorized(s, now, t, first, tau)
    for a, b in zip(small, big, strict=True):
        assert a.tolist() == b.tolist()


def test_qoe_wait_served_takes_the_scalar_path_for_few_streams() -> None:
    s = Streams(np.array([1.0]), np.array([0.2]), np.array([3.0]), np.array([0.5]),
                np.array([1.0]))
    q_wait, q_serve = qoe_wait_served(s, 2.0, 12.0, np.array([0.1]), 0.05)
    assert q_wait.shape == q_serve.shape == (1,)
    assert q_serve[0] >= q_wait[0]
    assert q_wait.tolist() == _vectorized(s, 2.0, 12.0, np.array([0.1]), 0.05)[0].tolist()
