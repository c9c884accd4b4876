"""QoE over the next Δt if served or left waiting, for many requests at once.

Design note (Andes §4.1, Fig. 7). Q_serve,i(B) is request i's QoE at t = now + Δt if
its next token comes after a first delay f (one step τ(B) if running, a prefill if
waiting, a swap-in plus τ if swapped) and the following ones every τ(B); Q_wait,i is
its QoE at t with no new token. Both use DESIGN §5's mid-flight QoE at t:
    S_delay(t) = Σ_{k due} max(0, min(ℓ_k, E - (k-1)·inv)),   E = t - start,
    S_whole(t) = Σ_{k due} (E - (k-1)·inv),                    due: E - (k-1)·inv >= 0,
with ℓ_k the lateness of token k (∞ if undelivered). ℓ_k never decreases and
E - (k-1)·inv decreases, so the min switches once, at the first token still unread at
t; before it a token contributes max(ℓ_k, 0), after it the arithmetic term. Every
part is a closed form of the per-request summary in `state.py` (n, ℓ_n, Σ ℓ⁺) and of
f and τ: O(1) per request, vectorized over requests (and over batch sizes by
broadcasting `first`/`tau` to shape (K, N)). The result equals
`andante.metrics.qoe.qoe(..., now=t)` on the predicted timeline (tests check it).

Objectives (Appendix A): "avg" gain Q_serve - Q_wait; "min" gain
max(Q_min - Q_wait, 0) with Q_min the lowest current QoE (plus 1e-3 × the avg gain to
break its many ties); "perfect" gain [Q_serve = 1] - [Q_wait = 1] if Q_now = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from andante.policies.andes.state import RequestTable

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

    @classmethod
    def take(cls, table: RequestTable, idx: np.ndarray) -> Streams:
        return cls(table.start[idx], table.inv[idx], table.n[idx], table.late[idx],
                   table.pos[idx])

    def __len__(self) -> int:
        return len(self.start)


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
    e = t - s.start
    due = np.where(e >= 0, np.floor(e / s.inv) + 1.0, 0.0)
    whole = due * e - s.inv * due * (due - 1.0) * 0.5
    unread = np.minimum(np.maximum(s.n - np.floor((e - s.late) / s.inv) - 1.0, 0.0),
                        np.maximum(s.n - 1.0, 0.0))
    u = np.maximum(s.late, 0.0)
    delay = s.pos - unread * u
    k0 = s.n + 1.0 - unread  # first token whose term is arithmetic
    if first is not None:
        assert tau is not None
        new, read = _new_tokens(s, now, t, first, tau, e, u)
        delay = delay + new
        k0 = k0 + read
    delay = delay + _arith(k0, due, e, s.inv)
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
