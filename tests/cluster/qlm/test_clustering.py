import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.qlm.clustering import (
    _candidate_ks,
    _min_clusters,
    _tight,
    kmeans,
    length_clusters,
)

lengths = st.lists(st.tuples(st.integers(1, 8000), st.integers(1, 4000)), min_size=1,
                   max_size=80)


def _reference_labels(points: np.ndarray, max_spread: float) -> np.ndarray:
    """Algorithm 1's k search without the lower bound: every candidate k in turn."""
    labels = np.zeros(len(points), dtype=int)
    for k in _candidate_ks(min(len(points), 64)):
        labels = kmeans(points, k)
        if all(np.ptp(points[labels == c], axis=0).max() <= max_spread
               for c in np.unique(labels)):
            break
    return labels


@settings(max_examples=60, deadline=None)
@given(lengths)
def test_skipping_ks_below_the_bound_gives_the_labels_of_trying_every_k(pairs):
    inputs, outputs = np.array(pairs).T
    points = np.log2(np.column_stack([inputs, outputs]).astype(float))
    assert np.array_equal(length_clusters(inputs, outputs),
                          _reference_labels(points, 2.0))


@settings(max_examples=60, deadline=None)
@given(lengths, st.integers(1, 12))
def test_no_k_below_the_bound_is_tight(pairs, k):
    points = np.log2(np.array(pairs, dtype=float))
    if k < _min_clusters(points, 2.0):
        assert not _tight(points, kmeans(points, k), 2.0)


def test_bound_counts_the_intervals_covering_one_feature():
    points = np.log2(np.array([[1, 1], [2, 1], [64, 1], [1024, 1]], dtype=float))
    assert _min_clusters(points, 2.0) == 3  # {1, 2}, {64}, {1024} in log2: 0-1, 6, 10


def test_labels_number_clusters_in_order_of_first_appearance():
    points = np.array([[10.0, 10.0], [0.0, 0.0], [10.0, 10.0], [0.0, 0.0]])
    assert kmeans(points, 2).tolist() == [0, 1, 0, 1]
