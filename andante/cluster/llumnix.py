"""`--router llumnix`: least-loaded dispatch plus the Llumnix-like rebalancer's options.

The rebalancer itself (migrating waiting requests and running requests' KV between
instances) is a cluster operator built with the simulated cluster: andante.sim.llumnix.
"""

from __future__ import annotations

from typing import Any

from andante.cluster.router import LeastLoadedRouter


class LlumnixRouter(LeastLoadedRouter):
    name = "llumnix"

    def __init__(self, high: float = 0.9, low: float = 0.6, link: str = "rdma-200g",
                 check_interval: float = 0.05, **options: Any) -> None:
        super().__init__(**options)
        if not 0 < float(low) < float(high):
            raise ValueError(f"router llumnix: need 0 < low < high, got {low}, {high}")
        self.high, self.low = float(high), float(low)
        self.link = str(link)
        self.check_interval = float(check_interval)
