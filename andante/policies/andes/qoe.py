"""What serving a request is worth (Andes §3-§4.1, Appendix A): the request tracker's
QoE state, the QoE a stream will have at a future time, and the objective's gain.

Design note (Andes §3.1-§3.2, the "Request Tracker"). With start = arrival + TTFT
target and inv = 1 / tds, token k (1-based) is ideally read at start + (k-1)·inv and
actually at C_k = max(arrival_k, C_{k-1} + inv). Its lateness ℓ_k = C_k - ideal_k is
a running maximum, ℓ_k = max(ℓ_{k-1}, arrival_k - (k-1)·inv - start), so three
numbers summarize a whole timeline for every QoE prediction: n (tokens delivered),
late = ℓ_n and pos = Σ_k max(ℓ_k, 0). Each new token updates them in O(1); the
scheduler never re-reads timelines. The reader's buffer (what the token pacer holds)
runs dry at C_n = start + (n-1)·inv + ℓ_n. The closed forms that predict QoE from these
three numbers, and the gains built on them, follow `RequestTable` (their own note).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from andante.core.request import Request
from andante.core.sampling import DEFAULT_TDS, DEFAULT_TTFT_TARGET

#: Lateness of "no token yet": far below any real lateness, finite for the arithmetic.
NO_LATENESS = -1e9
_FIELDS = ("start", "inv", "n", "late", "pos", "prompt")  # `RequestTable.state` rows
_INV, _N, _LATE, _POS = 1, 2, 3, 4
_FEW_TERMS = 64  # `record_run` folds up to this many late tokens in plain Python


class RequestTable:
    """Struct-of-arrays state of live requests; `indices(reqs)` gives their slots."""

    def __init__(self, capacity: int = 1024) -> None:
        self._slots: dict[Request, int] = {}
        self._free: list[int] = []
        self._size = 0
        self._init_arrays(max(1, capacity))

    def _init_arrays(self, capacity: int) -> None:
        # one row per field (`_FIELDS`), so that a decision or a run's replay gathers
        # every field of its requests in one indexing operation (`state[:, idx]`)
        self.state = np.zeros((len(_FIELDS), capacity))
        self.state[_INV] = 1.0
        self.state[_LATE] = NO_LATENESS
        self._bind_rows()

    def _bind_rows(self) -> None:
        """The fields as views of `state`'s rows."""
        (self.start,  # arrival + TTFT target (s)
         self.inv,  # 1 / reading speed (s per token)
         self.n,  # tokens delivered
         self.late,  # lateness of the last token (s)
         self.pos,  # sum of positive lateness (s)
         self.prompt) = self.state  # prompt tokens

    def _grow(self) -> None:
        old = self.state
        self._init_arrays(2 * old.shape[1])
        self.state[:, : old.shape[1]] = old

    def add(self, req: Request) -> int:
        """Track `req` (idempotent); replays tokens it already has."""
        slot = self._slots.get(req)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
        else:
            if self._size == len(self.start):
                self._grow()
            slot = self._size
            self._size += 1
        slo = req.slo
        ttft = slo.ttft if slo.ttft is not None else DEFAULT_TTFT_TARGET
        tds = slo.tds if slo.tds is not None else DEFAULT_TDS
        self.start[slot] = req.arrival_time + ttft
        self.inv[slot] = 1.0 / tds
        self.n[slot] = 0.0
        self.late[slot] = NO_LATENESS
        self.pos[slot] = 0.0
        self.prompt[slot] = req.num_prompt_tokens
        self._slots[req] = slot
        for t in req.timeline.token_times:
            self.record(np.array([slot]), t)
        return slot

    def remove(self, req: Request) -> None:
        slot = self._slots.pop(req, None)
        if slot is not None:
            self._free.append(slot)

    def indices(self, reqs: Sequence[Request]) -> np.ndarray:
        """Slots of `reqs` (tracking any request not seen yet)."""
        try:
            return np.fromiter(map(self._slots.__getitem__, reqs), dtype=np.intp,
                               count=len(reqs))
        except KeyError:
            return np.fromiter(map(self.add, reqs), dtype=np.intp, count=len(reqs))

    def slots_of(self, reqs: Iterable[Request]) -> list[int]:
        """Slots of the tracked requests among `reqs` (others skipped)."""
        get = self._slots.get
        return [s for s in map(get, reqs) if s is not None]

    def record(self, idx: np.ndarray, now: float) -> None:
        """One new token at `now` for each slot of `idx` (distinct slots)."""
        start, inv, *_ = state = self.state.take(idx, axis=1)  # (a copy: one gather)
        n, late, pos = state[_N:_POS + 1]
        np.maximum(late, now - n * inv - start, out=late)
        pos += np.maximum(late, 0.0)
        n += 1.0
        self.state[_N:_POS + 1, idx] = state[_N:_POS + 1]

    def record_run(self, idx: np.ndarray, times: np.ndarray) -> None:
        """One new token at each of `times` (increasing) for each slot of `idx`: what
        `record` once per time does, bit for bit (a simulator decode run). Lateness is
        a running maximum, and Σ ℓ⁺ grows only where it is positive (a stream ahead
        of its reader adds 0.0 per token), so only those rows are summed step by step.
        No token of the run is later than `bound` (the last time taken as the first
        token's; rounding is monotone), so a row whose lateness is at least that and
        not positive only counts its tokens: most rows, while streams are ahead of
        their readers."""
        k = len(times)
        start, inv, n, late, _, _ = self.state.take(idx, axis=1)  # (one gather)
        times = np.asarray(times, dtype=float)
        bound = times[-1] - n * inv - start
        rows = ((bound > late) | (late > 0.0)).nonzero()[0]
        if len(rows):
            slots = idx[rows]
            state = self.state.take(slots, axis=1)
            if len(rows) * k <= _FEW_TERMS:
                _fold_late_few(state, times.tolist())
            else:
                _fold_late(state, times)
            self.state[_LATE:_POS + 1, slots] = state[_LATE:_POS + 1]
        self.state[_N, idx] = n + float(k)

    def record_few(self, slots: Sequence[int], times: Sequence[float]) -> None:
        """`record_run` in plain Python floats, the same operations in the same order
        (bit-identical): faster while `few_records` says so (numpy's per-call cost)."""
        n_of, late_of, pos_of = self.n, self.late, self.pos
        for slot in slots:
            n, late, pos = float(n_of[slot]), float(late_of[slot]), float(pos_of[slot])
            inv, start = float(self.inv[slot]), float(self.start[slot])
            for now in times:
                late = max(late, now - n * inv - start)
                pos += max(late, 0.0)
                n += 1.0
            n_of[slot], late_of[slot], pos_of[slot] = n, late, pos

    @staticmethod
    def few_records(num_slots: int, num_times: int) -> bool:
        """Is `record_few` the faster way to record `num_times` tokens for `num_slots`
        requests? (Measured: numpy's `record` is cheap below three tokens, its
        `record_run` costs about as much as 50 plain-Python updates.)"""
        return num_slots <= 4 or (num_times >= 3 and num_slots * num_times <= 48)

    def buffered(self, idx: np.ndarray, now: float) -> np.ndarray:
        """Seconds of text the reader still has in its pacer buffer at `now` (>= 0)."""
        start, inv, n, late, _, _ = self.state.take(idx, axis=1)  # (one gather)
        return _buffered(start, inv, n, late, now)


def _buffered(start: np.ndarray, inv: np.ndarray, n: np.ndarray, late: np.ndarray,
              now: float) -> np.ndarray:
    """`RequestTable.buffered` of streams with these fields."""
    dry = start + (n - 1.0) * inv + late
    return np.where(n > 0, np.maximum(dry - now, 0.0), 0.0)


def _fold_late(state: np.ndarray, times: np.ndarray) -> None:
    """`record_run`'s lateness and Σ ℓ⁺ of the gathered `state`'s requests."""
    start, inv, n, late, pos, _ = state
    steps = n[:, None] + np.arange(len(times), dtype=float)
    gap = times - steps * inv[:, None] - start[:, None]  # (now - n·inv) - start
    end = np.maximum(late, gap.max(axis=1))
    positive = (end > 0.0).nonzero()[0]
    if len(positive):
        running = np.maximum(np.maximum.accumulate(gap[positive], axis=1),
                             late[positive, None])
        terms = np.empty((len(positive), len(times) + 1))
        terms[:, 0] = pos[positive]
        np.maximum(running, 0.0, out=terms[:, 1:])
        pos[positive] = np.cumsum(terms, axis=1)[:, -1]  # sequential, as `record`
    state[_LATE] = end


def _fold_late_few(state: np.ndarray, times: list[float]) -> None:
    """`_fold_late` in plain Python floats (`record_few`'s arithmetic, bit-identical)."""
    for column, (start, inv, n, late, pos, _) in enumerate(state.T.tolist()):
        for now in times:
            late = max(late, now - n * inv - start)
            pos += max(late, 0.0)
            n += 1.0
        state[_LATE, column], state[_POS, column] = late, pos


# Design note (Andes §4.1, Fig. 7). Q_serve,i(B) is request i's QoE at t = now + Δt if
# its next token comes after a first delay f (one step τ(B) if running, a prefill if
# waiting, a swap-in plus τ if swapped) and the following ones every τ(B); Q_wait,i is
# its QoE at t with no new token. Both use DESIGN §5's mid-flight QoE at t:
#     S_delay(t) = Σ_{k due} max(0, min(ℓ_k, E - (k-1)·inv)),   E = t - start,
#     S_whole(t) = Σ_{k due} (E - (k-1)·inv),                    due: E - (k-1)·inv >= 0,
# with ℓ_k the lateness of token k (∞ if undelivered). ℓ_k never decreases and
# E - (k-1)·inv decreases, so the min switches once, at the first token still unread at
# t; before it a token contributes max(ℓ_k, 0), after it the arithmetic term. Every
# part is a closed form of the per-request summary above (n, ℓ_n, Σ ℓ⁺) and of
# f and τ: O(1) per request, vectorized over requests (and over batch sizes by
# broadcasting `first`/`tau` to shape (K, N)). The result equals
# `andante.metrics.qoe.qoe(..., now=t)` on the predicted timeline (tests check it).
#
# Objectives (Appendix A): "avg" gain Q_serve - Q_wait; "min" gain
# max(Q_min - Q_wait, 0) with Q_min the lowest current QoE (plus 1e-3 × the avg gain to
# break its many ties); "perfect" gain [Q_serve = 1] - [Q_wait = 1] if Q_now = 1.
ArrayLike = np.ndarray | float
PERFECT = 1.0 - 1e-9  # QoE at or above this counts as perfect
MIN_TIE_BREAK = 1e-3


@dataclass(slots=True)
class Streams:
    """The QoE summaries of some requests, gathered for one decision."""

    start: np.ndarray
    inv: np.ndarray
    n: np.ndarray
    late: np.ndarray
    pos: np.ndarray

    def buffered(self, now: float, stop: int) -> np.ndarray:
        """`RequestTable.buffered` of the first `stop` streams (no gather)."""
        return _buffered(self.start[:stop], self.inv[:stop], self.n[:stop],
                         self.late[:stop], now)

    def select(self, positions: np.ndarray | slice) -> Streams:
        return Streams(self.start[positions], self.inv[positions], self.n[positions],
                       self.late[positions], self.pos[positions])


def _arith(first: np.ndarray, last: np.ndarray, e: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Σ_{k=first}^{last} (e - (k-1)·inv); 0 where last < first."""
    cnt = np.maximum(last - first + 1.0, 0.0)
    return cnt * e - inv * (first + last - 2.0) * cnt * 0.5


def _new_tokens(s: Streams, now: float, t: float, first: ArrayLike, tau: ArrayLike,
                e: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S_delay of new tokens read by t, how many of them are read by t)."""
    h = t - now - first  # time left for new tokens after the first delay
    m = np.where(h >= 0, np.floor(h / tau) + 1.0, 0.0)  # new tokens delivered by t
    g = now + first - s.n * s.inv - s.start  # lateness of the first one if read at once
    sig = np.maximum(tau - s.inv, 0.0)  # growth of lateness per token when slower
    j_old = np.floor((e - s.late) / s.inv) - s.n + 1.0  # old tokens still unread
    j_new = np.floor(h / (sig + s.inv)) + 1.0
    jc = np.minimum(np.maximum(np.minimum(j_old, j_new), 0.0), m)  # new tokens read by t
    safe = np.where(sig > 0, sig, 1.0)
    j0 = np.where(sig > 0, np.minimum(np.maximum(np.floor((u - g) / safe) + 1.0, 0.0), jc),
                  np.where(g <= u, jc, 0.0))  # of which lateness <= u (then u counts)
    delay = j0 * u + (jc - j0) * g + sig * (jc * (jc - 1.0) - j0 * (j0 - 1.0)) * 0.5
    return delay, jc


def qoe_at(s: Streams, now: float, t: float, first: ArrayLike | None = None,
           tau: ArrayLike | None = None) -> np.ndarray:
    """QoE of each stream at time t >= now; served from now (first, tau) or not."""
    base = _Base.of(s, t)
    if first is None:
        return base.qoe(s, base.delay, base.k0)
    assert tau is not None
    new, read = _new_tokens(s, now, t, first, tau, base.e, base.u)
    return base.qoe(s, base.delay + new, base.k0 + read)


def qoe_wait_served(s: Streams, now: float, t: float, first: ArrayLike,
                    tau: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(qoe_at(s, now, t), qoe_at(s, now, t, first, tau)), sharing their common part."""
    if len(s.n) <= SMALL_STREAMS and np.ndim(tau) == 0 and np.ndim(first) == 1:
        return qoe_wait_served_small(s.start, s.inv, s.n, s.late, s.pos, now, t,
                                     np.asarray(first), float(tau))
    base = _Base.of(s, t)
    new, read = _new_tokens(s, now, t, first, tau, base.e, base.u)
    return (base.qoe(s, base.delay, base.k0),
            base.qoe(s, base.delay + new, base.k0 + read))


@dataclass(slots=True)
class _Base:
    """The part of `qoe_at` that does not depend on new tokens."""

    e: np.ndarray
    due: np.ndarray
    whole: np.ndarray
    u: np.ndarray
    delay: np.ndarray  # S_delay of the delivered tokens before k0
    k0: np.ndarray  # first token whose term is arithmetic

    @classmethod
    def of(cls, s: Streams, t: float) -> _Base:
        e = t - s.start
        due = np.where(e >= 0, np.floor(e / s.inv) + 1.0, 0.0)
        whole = due * e - s.inv * due * (due - 1.0) * 0.5
        unread = np.minimum(np.maximum(s.n - np.floor((e - s.late) / s.inv) - 1.0, 0.0),
                            np.maximum(s.n - 1.0, 0.0))
        u = np.maximum(s.late, 0.0)
        return cls(e, due, whole, u, s.pos - unread * u, s.n + 1.0 - unread)

    def qoe(self, s: Streams, delay: np.ndarray, k0: np.ndarray) -> np.ndarray:
        delay = delay + _arith(k0, self.due, self.e, s.inv)
        whole = self.whole
        safe = np.where(whole > 0, whole, 1.0)
        return np.where(whole > 0, np.minimum(np.maximum(1.0 - delay / safe, 0.0), 1.0), 1.0)


def objective_gain(objective: str, q_serve: np.ndarray, q_wait: np.ndarray,
                   q_now: np.ndarray, q_min: float = 1.0) -> np.ndarray:
    """Knapsack item values for `objective` (shape of q_serve). q_now: the items'
    current QoE ("perfect"); q_min: the lowest current QoE of all requests ("min")."""
    avg = np.maximum(q_serve - q_wait, 0.0)
    if objective == "avg":
        return avg
    if objective == "min":
        return np.maximum(q_min - q_wait, 0.0) + MIN_TIE_BREAK * avg
    if objective == "perfect":
        keep = (q_serve >= PERFECT) & (q_wait < PERFECT) & (q_now >= PERFECT)
        return keep.astype(float)
    raise ValueError(f"unknown objective {objective!r}")


def qoe_gain(s: Streams, now: float, delta_t: float, first: ArrayLike, tau: ArrayLike,
             objective: str, everyone: Streams) -> np.ndarray:
    """The objective's gain over Δt of serving each of `s` (its next token after `first`,
    the following every `tau`) rather than not (knapsack item values, Eq. 5 / Appendix
    A); `everyone`: the streams of the whole decision ("min": their lowest QoE now)."""
    t = now + delta_t
    q_wait, q_serve = qoe_wait_served(s, now, t, first, tau)
    if objective == "avg":
        return objective_gain(objective, q_serve, q_wait, q_wait)
    q_now = qoe_at(s, now, now)
    q_min = float(qoe_at(everyone, now, now).min())
    return objective_gain(objective, q_serve, q_wait, q_now, q_min)


# Design note (Andes §3.1-§3.2, §4.1; the closed forms above), the scalar path.
# Between knapsack solves the policy scores only the queued requests
# (`_queue_scores`), usually one to three of them, and numpy's per-call overhead then
# outweighs the arithmetic some fortyfold: the vectorized closed form runs about forty
# array operations. Below `SMALL_STREAMS` streams `qoe_wait_served_small` evaluates
# the same formulas, operation for operation and in the same order, on Python floats
# (IEEE doubles, as numpy's float64), so the result is bit-identical; tests compare
# both paths.

#: Up to this many streams the scalar path is faster than the vectorized one.
SMALL_STREAMS = 8


def _floor(x: float) -> float:
    return float(math.floor(x))


def _qoe(delay: float, k0: float, due: float, e: float, inv: float, whole: float) -> float:
    """`_Base.qoe` for one stream (`_arith` inlined)."""
    cnt = max(due - k0 + 1.0, 0.0)
    delay = delay + (cnt * e - inv * (k0 + due - 2.0) * cnt * 0.5)
    return min(max(1.0 - delay / whole, 0.0), 1.0) if whole > 0 else 1.0


def _pair(start: float, inv: float, n: float, late: float, pos: float, now: float,
          t: float, first: float, tau: float) -> tuple[float, float]:
    """(QoE at t without a new token, QoE at t served from now): one stream."""
    e = t - start  # _Base.of
    due = _floor(e / inv) + 1.0 if e >= 0 else 0.0
    whole = due * e - inv * due * (due - 1.0) * 0.5
    behind = _floor((e - late) / inv)
    unread = min(max(n - behind - 1.0, 0.0), max(n - 1.0, 0.0))
    u = max(late, 0.0)
    delay, k0 = pos - unread * u, n + 1.0 - unread
    h = t - now - first  # _new_tokens
    m = _floor(h / tau) + 1.0 if h >= 0 else 0.0
    g = now + first - n * inv - start
    sig = max(tau - inv, 0.0)
    j_old = behind - n + 1.0
    j_new = _floor(h / (sig + inv)) + 1.0
    jc = min(max(min(j_old, j_new), 0.0), m)
    j0 = min(max(_floor((u - g) / sig) + 1.0, 0.0), jc) if sig > 0 else (
        jc if g <= u else 0.0)
    new = j0 * u + (jc - j0) * g + sig * (jc * (jc - 1.0) - j0 * (j0 - 1.0)) * 0.5
    return (_qoe(delay, k0, due, e, inv, whole),
            _qoe(delay + new, k0 + jc, due, e, inv, whole))


def qoe_wait_served_small(start: np.ndarray, inv: np.ndarray, n: np.ndarray,
                          late: np.ndarray, pos: np.ndarray, now: float, t: float,
                          first: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """`qoe_wait_served` for 1-D `first` and a scalar `tau`."""
    now, t, tau = float(now), float(t), float(tau)
    rows = zip(start.tolist(), inv.tolist(), n.tolist(), late.tolist(), pos.tolist(),
               first.tolist(), strict=True)
    pairs = [_pair(s, i, k, lt, p, now, t, f, tau) for s, i, k, lt, p, f in rows]
    return (np.array([p[0] for p in pairs], dtype=float),
            np.array([p[1] for p in pairs], dtype=float))
