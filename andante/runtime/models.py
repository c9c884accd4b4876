"""The models of one real-engine instance, in QLM's three tiers: device, host, disk.

Design note (QLM §5, LSO 5 "model swapping" and warm start): an instance serves one
model at a time (its engine's executor holds the device copy); other models may be kept
warm as a copy of their weights in host memory, the rest are cold (their checkpoint on
disk). Swapping in a warm model builds the executor from the host copy (no file read,
no dequantization); a cold one loads the checkpoint first. The outgoing model stays warm
when the host budget allows it, else it goes cold (its host copy is dropped). The time
of each swap is measured, for the log and `/metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

WARM, COLD = "warm", "cold"

Load = Callable[[str], Any]  # model name -> its weights read from disk (a cold load)
Size = Callable[[Any], int]  # weights -> their bytes in host memory


@dataclass(frozen=True, slots=True)
class ModelSwap:
    """One swap: the models out and in, the tier it came from, seconds, requests evicted."""

    outgoing: str
    incoming: str
    tier: str  # WARM or COLD
    seconds: float
    num_evicted: int


class ModelTiers:
    """Which model is on the device, which are warm (weights in host memory), and how to
    load a cold one. `host_capacity_bytes` caps the warm copies (None: no cap)."""

    def __init__(self, device: str, weights: Mapping[str, Any], models: tuple[str, ...],
                 load: Load, size: Size, host_capacity_bytes: int | None = None) -> None:
        if device not in models:
            raise ValueError(f"device model {device!r} is not one of {list(models)}")
        self.models = models
        self.device = device
        self.device_weights = weights[device]
        self._load, self._size = load, size
        self.host_capacity_bytes = host_capacity_bytes
        self.host: dict[str, Any] = {}
        for name, w in weights.items():
            if name != device:
                self.keep_warm(name, w)

    def check(self, model: str) -> None:
        if model not in self.models:
            raise ValueError(f"unknown model {model!r}; this instance serves {list(self.models)}")

    @property
    def host_bytes(self) -> int:
        return sum(self._size(w) for w in self.host.values())

    def keep_warm(self, model: str, weights: Any) -> bool:
        """Keep `weights` in host memory if they fit the budget (False: left cold)."""
        cap = self.host_capacity_bytes
        if cap is not None and self.host_bytes + self._size(weights) > cap:
            return False
        self.host[model] = weights
        return True

    def fetch(self, model: str) -> tuple[Any, str, float]:
        """The weights of `model` (from host memory, else from disk), the tier they came
        from and the seconds it took."""
        self.check(model)
        start = time.perf_counter()
        weights = self.host.pop(model, None)
        tier = WARM
        if weights is None:
            weights, tier = self._load(model), COLD
        return weights, tier, time.perf_counter() - start

    def activate(self, model: str, weights: Any) -> None:
        """`model` is on the device now; the outgoing one stays warm if it fits."""
        outgoing, outgoing_weights = self.device, self.device_weights
        self.device, self.device_weights = model, weights
        self.keep_warm(outgoing, outgoing_weights)

    def read(self, model: str) -> Any:
        """`model`'s weights read from disk (any thread: it touches no state here)."""
        self.check(model)
        return self._load(model)

    def needs_warming(self, model: str) -> bool:
        self.check(model)
        return model != self.device and model not in self.host
