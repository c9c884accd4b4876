"""Where one instance keeps its models: the device (serving), host memory (warm), disk.

Design note (QLM §5 "Model Warm Start", LSO 5). An instance serves one model at a time;
any other model it may serve sits in host memory (warm) or in the model registry on disk
(cold). Serving a cold model takes two copies, storage -> CPU memory -> GPU; a warm one
only the second. The model that leaves the device stays in host memory (a swap keeps it
warm). Host memory for weights is bounded: the least recently used warm model is dropped
first. A warm start (`warm`) reads a cold model into host memory ahead of need.

One `ModelTiers` for both clocks (DESIGN.md §4): the simulator gives it the hardware and
asks it for the modelled load times (the weights' bytes over the tier's bandwidth from
the hardware catalog: the disk's read rate for the first copy, the host link for the
second, each of the `tp` GPUs loading its own shard over its own link, in parallel; a swap
before a warm start's read ends waits for the rest of it: `host_ready`). The runtime's
worker measures its loads instead and keeps the real weights of the device and warm
models in `weights` (opaque objects here: a model dropped from host memory drops them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from andante.perf.specs import HardwareSpec

DEVICE, HOST, DISK = "device", "host", "disk"


@dataclass(frozen=True, slots=True)
class ModelSwap:
    """One model swap: when, what left, what came in, from which tier (HOST: a warm start,
    DISK: a cold one), the seconds its load took and the requests it handed back."""

    time: float
    outgoing: str
    incoming: str
    source: str
    seconds: float
    num_evicted: int

    @property
    def tier(self) -> str:
        """"warm" or "cold" (QLM's words; the server's metrics label)."""
        return "warm" if self.source == HOST else "cold"


@dataclass(slots=True)
class ModelTiers:
    """The models one instance may serve and where each of them is now.

    `weight_bytes`: every model it may serve (the registry); `device`: the one serving;
    `host`: warm models, least recently used first; `host_capacity_bytes`: the host
    memory for warm weights (None: unbounded); `host_ready`: when an in-progress disk
    read (a warm start) of a host model completes; `hardware` and `tp`: what the
    modelled load times need (the simulator's); `weights`: the real weights of the device
    and warm models, where the instance keeps them (the runtime's).
    """

    weight_bytes: Mapping[str, int]
    device: str
    hardware: HardwareSpec | None = None
    tp: int = 1
    host_capacity_bytes: int | None = None
    host: list[str] = field(default_factory=list)
    host_ready: dict[str, float] = field(default_factory=dict)
    weights: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model in (self.device, *self.host):
            self.check(model)
        if self.host_capacity_bytes is not None and self.host_capacity_bytes < 0:
            raise ValueError(f"host_capacity_bytes must be >= 0, got {self.host_capacity_bytes}")
        self.host = [m for m in self.host if m != self.device]
        self._fit_host()

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.weight_bytes)

    def check(self, model: str) -> None:
        """ValueError naming the known models if `model` is not one of them."""
        if model not in self.weight_bytes:
            raise ValueError(f"unknown model {model!r}; this instance serves "
                             f"{sorted(self.weight_bytes)}")

    def tier(self, model: str) -> str:
        self.check(model)
        if model == self.device:
            return DEVICE
        return HOST if model in self.host else DISK

    # ---- modelled load times (the simulator's) ----------------------------------------
    def _bandwidths(self) -> HardwareSpec:
        if self.hardware is None:
            raise ValueError("these tiers have no hardware: their load times are measured")
        return self.hardware

    def disk_time(self, model: str) -> float:
        return self.weight_bytes[model] / self._bandwidths().disk_bandwidth

    def link_time(self, model: str) -> float:
        return self.weight_bytes[model] / self.tp / self._bandwidths().host_link_bandwidth

    def load_time(self, model: str, now: float) -> float:
        """Seconds until `model` could serve if a swap to it started at `now`."""
        tier = self.tier(model)
        if tier == DEVICE:
            return 0.0
        if tier == HOST:
            return max(0.0, self.host_ready.get(model, now) - now) + self.link_time(model)
        return self.disk_time(model) + self.link_time(model)

    # ---- moves --------------------------------------------------------------------------
    def activate(self, model: str) -> str:
        """Make `model` the device model; returns the tier it came from. The outgoing
        model stays warm in host memory (the least recently used ones make room)."""
        source = self.tier(model)
        if source == DEVICE:
            return source
        outgoing, self.device = self.device, model
        if model in self.host:
            self.host.remove(model)
        self.host_ready.pop(model, None)
        self.host.append(outgoing)
        self._fit_host()
        return source

    def warm(self, model: str, now: float) -> bool:
        """Start reading a cold `model` into host memory (warm start; with hardware its
        read completes after the disk time, else it is in host memory now); False if it
        is already warm or on the device, or does not fit in host memory."""
        if self.tier(model) != DISK or not self._fits(self.weight_bytes[model]):
            return False
        self.host.append(model)
        if self.hardware is not None:
            self.host_ready[model] = now + self.disk_time(model)
        self._fit_host(keep=model)
        return True

    def _fits(self, num_bytes: int) -> bool:
        return self.host_capacity_bytes is None or num_bytes <= self.host_capacity_bytes

    def _fit_host(self, keep: str | None = None) -> None:
        """Drop least recently used warm models until the rest fit in host memory."""
        while self.host and not self._fits(sum(self.weight_bytes[m] for m in self.host)):
            victim = next((m for m in self.host if m != keep), None)
            if victim is None:
                return
            self.host.remove(victim)
            self.host_ready.pop(victim, None)
            self.weights.pop(victim, None)


def placed_tiers(index: int, weight_bytes: Mapping[str, int],
                 host_capacity_bytes: int | None) -> ModelTiers:
    """Where instance `index` of a server starts (QLM §3, §5): every instance may serve
    every model; model `index` mod M is on its device (round robin over the models in
    order) and the others are warm in host memory, in order, while they fit."""
    models = list(weight_bytes)
    device = models[index % len(models)]
    warm = first_that_fit((m for m in models if m != device), weight_bytes,
                          host_capacity_bytes)
    return ModelTiers(weight_bytes, device, host_capacity_bytes=host_capacity_bytes,
                      host=warm)


def first_that_fit(models: Iterable[str], weight_bytes: Mapping[str, int],
                   capacity_bytes: int | None) -> list[str]:
    """Each of `models` in order while it fits beside the ones before it."""
    kept: list[str] = []
    used = 0
    for model in models:
        size = weight_bytes[model]
        if capacity_bytes is None or used + size <= capacity_bytes:
            kept.append(model)
            used += size
    return kept
