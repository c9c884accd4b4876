"""k-means over request lengths: the clustering step of QLM's Algorithm 1 (§4).

Design note. Algorithm 1 clusters the queued requests of one model and SLO class on
their input and output token counts (Def. 4.1) before splitting large clusters. Lengths
spread over orders of magnitude, so the features are log2(input tokens) and
log2(expected output tokens). k is not given by the paper; we take the smallest k whose
k-means clusters each span at most `max_spread` (in log2 units: 2.0 = a factor of 4) in
both features, so similar requests share a group and a 100-token prompt never shares
one with a 2,000-token prompt (k tried as 1, 2, 3, 4, 6, 8, 12, ..., at most 64).
Lloyd's iterations from deterministic seeds (the points at evenly spaced ranks of the
feature sum), so the same queue gives the same clusters.
"""

from __future__ import annotations

import numpy as np

MAX_ITERATIONS = 25
MAX_CLUSTERS = 64  # per model and SLO class: beyond, the last k's clusters are kept


def kmeans(points: np.ndarray, k: int) -> np.ndarray:
    """Cluster labels (0..k-1, in order of first appearance) of `points` [n, d]."""
    n = len(points)
    k = max(1, min(k, n))
    order = np.argsort(points.sum(axis=1), kind="stable")
    centers = points[order[np.linspace(0, n - 1, k).round().astype(int)]].copy()
    labels = np.zeros(n, dtype=int)
    for _ in range(MAX_ITERATIONS):
        distance = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
        new = distance.argmin(axis=1)
        if _ and np.array_equal(new, labels):
            break
        labels = new
        for c, members in _members(points, labels):
            centers[c] = members.mean(axis=0)
    _, first = np.unique(labels, return_index=True)
    rank = np.empty(int(labels.max()) + 1, dtype=int)
    rank[labels[np.sort(first)]] = np.arange(len(first))
    return rank[labels]


def _members(points: np.ndarray, labels: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(label, its points in index order) per label present: one stable sort, the same
    arrays as `points[labels == c]`."""
    order = np.argsort(labels, kind="stable")
    cuts = np.flatnonzero(np.diff(labels[order])) + 1
    return [(int(labels[chunk[0]]), points[chunk]) for chunk in np.split(order, cuts)]


def _tight(points: np.ndarray, labels: np.ndarray, max_spread: float) -> bool:
    return all((members.max(axis=0) - members.min(axis=0)).max() <= max_spread
               for _, members in _members(points, labels))


def _min_clusters(points: np.ndarray, max_spread: float) -> int:
    """A lower bound on the clusters of span <= `max_spread`: per feature, the fewest
    intervals of that length covering its values (greedy, exact in one dimension)."""
    need = 1
    for values in np.sort(points, axis=0).T:
        count, start = 0, -np.inf
        for v in values.tolist():
            if v - start > max_spread:
                count, start = count + 1, v
        need = max(need, count)
    return need


def length_clusters(input_tokens: np.ndarray, output_tokens: np.ndarray,
                    max_spread: float = 2.0) -> np.ndarray:
    """Cluster labels of requests by (input, output) length (module note). A k below
    `_min_clusters` cannot be tight, so its k-means is skipped: the same labels."""
    if max_spread <= 0:
        raise ValueError(f"max_spread must be > 0, got {max_spread!r}")
    points = np.log2(np.column_stack([np.maximum(input_tokens, 1),
                                      np.maximum(output_tokens, 1)]).astype(float))
    n = len(points)
    if n == 0:
        return np.zeros(0, dtype=int)
    labels = np.zeros(n, dtype=int)
    ks = _candidate_ks(min(n, MAX_CLUSTERS))
    floor = _min_clusters(points, max_spread)
    for k in [k for k in ks[:-1] if k >= floor] + ks[-1:]:
        labels = kmeans(points, k)
        if _tight(points, labels, max_spread):
            break
    return labels


def _candidate_ks(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to `limit` (a k-means run per candidate)."""
    ks, k = [], 1
    while k < limit:
        ks.append(k)
        k = k + 1 if k < 4 else k + k // 2
    return [*ks, limit]
