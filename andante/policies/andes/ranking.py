"""The queue's priority order of one `andes` decision, computed only as far as needed.

Design note (Andes §4.2 Eq. 6, Algorithm 1's `break`; §4.3). Between knapsack solves
the policy admits the queue in priority order and stops at the first request that
does not fit; the refiner pairs admissions in the same order and stops alike. So
when the request first in line is not admitted (memory pressure: a long queue waits
for blocks) the rest of the order, and the QoE gains it is sorted by, decide nothing.
The first in line is known without any gain when a queued request is starved
(`knapsack.priority`: STARVED plus its wait, above any gain per block, which is at
most 1.001 for every objective) and its priority is the unique largest: it is then
the first index of `top_order` (a stable sort of the priorities, after a partition
that keeps the largest). `QueueRanking` gives that first request at once and
computes the gains, the priorities and the whole order only when asked
(`order`, `scores`); the values are those of the plain computation, bit for bit
(tests compare both).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from andante.policies.andes.knapsack import STARVED, View, priority, top_order
from andante.policies.andes.options import AndesOptions

#: τ, the queued requests' gains and every view position's starvation (or None).
Scores = tuple[float, np.ndarray, np.ndarray | None]


class QueueRanking:
    """The queued requests of `view` in priority order, lazily. `score()` gives τ and
    the queued requests' gains (`AndesPolicy._queue_scores`); `starved` is
    `knapsack.starvation` of the view now."""

    def __init__(self, view: View, options: AndesOptions, max_num_seqs: int,
                 starved: np.ndarray | None,
                 score: Callable[[], tuple[float, np.ndarray]]) -> None:
        self.view = view
        self.options = options
        self.max_num_seqs = max_num_seqs
        self.starved = starved
        self._score = score
        self._scores: Scores | None = None
        self._order: np.ndarray | None = None

    @property
    def first(self) -> int:
        """The view position of the queued request first in priority order."""
        nr = self.view.num_running
        if len(self.view) == nr + 1:
            return nr
        sure = self.sure_first()
        return int(self.order()[0]) if sure is None else sure

    def sure_first(self) -> int | None:
        """The first in line if a starved request's priority is the unique largest
        (no gain needed: see the module note); None otherwise."""
        if self.starved is None:
            return None
        waits = self.starved[self.view.num_running:]
        starved = waits > 0
        prio = STARVED + waits  # (as `knapsack.priority` computes it, where starved)
        best = int(np.argmax(np.where(starved, prio, -np.inf)))
        if np.count_nonzero(starved & (prio == prio[best])) != 1:
            return None  # a tie: the stable sort decides among them
        return self.view.num_running + best

    def scores(self) -> Scores:
        if self._scores is None:
            tau, gain = self._score()
            self._scores = (tau, gain, self.starved)
        return self._scores

    def order(self) -> np.ndarray:
        """View positions of the queued requests by priority, highest first (the top
        `max_num_seqs`); one queued request is first whatever its score."""
        if self._order is None:
            view = self.view
            nr = view.num_running
            if len(view) == nr + 1:
                self._order = np.array([nr])
            else:
                _, gain, starved = self.scores()
                queued = view.queued
                prio = priority(gain, view.weight[queued], view.kind[queued], self.options,
                                None if starved is None else starved[queued])
                self._order = top_order(prio, self.max_num_seqs) + nr
        return self._order
