"""`qoe_wait_served` (gain.py) for a few streams, in plain Python floats.

Design note (Andes §3.1-§3.2, §4.1; the closed forms are gain.py's). Between knapsack
solves the policy scores only the queued requests (`_queue_scores`), usually one to
three of them, and numpy's per-call overhead then outweighs the arithmetic some
fortyfold: the vectorized closed form runs about forty array operations. Below
`SMALL_STREAMS` streams this module evaluates the same formulas, operation for
operation and in the same order, on Python floats (IEEE doubles, as numpy's float64),
so the result is bit-identical; tests compare both paths.
"""

from __future__ import annotations

import math

import numpy as np

#: Up to this many streams the scalar path is faster than the vectorized one.
SMALL_STREAMS = 8


def _floor(x: float) -> float:
    return float(math.floor(x))


def _qoe(delay: float, k0: float, due: float, e: float, inv: float, whole: float) -> float:
    """gain.py's `_Base.qoe` for one stream (`_arith` inlined)."""
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
    """gain.py's `qoe_wait_served` for 1-D `first` and a scalar `tau`."""
    now, t, tau = float(now), float(t), float(tau)
    rows = zip(start.tolist(), inv.tolist(), n.tolist(), late.tolist(), pos.tolist(),
               first.tolist(), strict=True)
    pairs = [_pair(s, i, k, lt, p, now, t, f, tau) for s, i, k, lt, p, f in rows]
    return (np.array([p[0] for p in pairs], dtype=float),
            np.array([p[1] for p in pairs], dtype=float))
