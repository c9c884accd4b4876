"""The `shepherd` router: SHEPHERD-like static placement of models on instances (QLM's
baseline, with the `static-batch` engine policy).

Design note (SHEPHERD, Zhang et al. NSDI 2023 §4 "Herd", as QLM §8 uses it): a
cluster-level planner partitions the models over serving groups so that each group
serves a fixed set of models and never swaps on demand; within a group, requests run in
deadline-ordered static batches (`andante.policies.static_batch`). SHEPHERD solves the
partition as an ILP over measured model loads; we place each model greedily when its
first request arrives, on the alive instance that holds the fewest models (then the
fewest requests), and keep it there. Requests with no model name go to the least-loaded
instance. The placement is static: a skewed mix leaves the instances of popular models
loaded and those of tail models idle, as the paper reports for SHEPHERD.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from andante.cluster.router import InstanceView, _load_key, _RouterBase
from andante.core.request import Request


class ShepherdRouter(_RouterBase):
    name = "shepherd"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._home: dict[str, int] = {}
        self._num_routed: dict[int, int] = {}

    def route(self, req: Request, instances: Sequence[InstanceView]) -> int | None:
        alive = [v for v in instances if v.alive]
        if not alive:
            return None
        if not req.model:
            return min(alive, key=_load_key).index
        home = self._home.get(req.model)
        if home is None or not instances[home].alive:
            home = min((v.index for v in alive), key=self._crowding)
            self._home[req.model] = home
        self._num_routed[home] = self._num_routed.get(home, 0) + 1
        return home

    def _crowding(self, index: int) -> tuple[int, int, int]:
        num_models = sum(1 for i in self._home.values() if i == index)
        return (num_models, self._num_routed.get(index, 0), index)
