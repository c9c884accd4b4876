"""Where a simulated instance keeps its models: device (serving), host memory (warm), disk.

Design note (QLM §5 "Model Warm Start", LSO 5): an instance serves one model at a time;
any other model it may serve sits in host memory (warm) or in the model registry on disk
(cold). Serving a cold model takes two copies, storage -> CPU memory -> GPU; a warm one
only the second. Their modelled times are the weights' bytes over the tier's bandwidth
from the hardware catalog: the disk's read rate for the first copy (the whole model
passes through one host), the host link for the second (each of the `tp` GPUs loads its
own shard over its own link, in parallel). The model that leaves the device stays in
host memory (a swap keeps it warm). Host memory for weights is bounded: the least
recently used warm model is dropped first. A warm start (`warm`) starts the disk read
ahead of need; a swap before it ends waits for the rest of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from andante.perf.specs import HardwareSpec

DEVICE, HOST, DISK = "device", "host", "disk"


@dataclass(frozen=True, slots=True)
class ModelSwap:
    """One model swap: what left, what came in, from which tier, and how long it took."""

    time: float
    outgoing: str
    incoming: str
    source: str  # HOST (warm) or DISK (cold)
    load_time: float
    num_evicted: int


@dataclass(slots=True)
class ModelTiers:
    """The models one instance may serve and where each of them is now.

    `weight_bytes`: every model it may serve (the registry); `device`: the one serving;
    `host`: warm models, least recently used first; `host_ready`: when an in-progress
    disk read (a warm start) of a host model completes.
    """

    weight_bytes: Mapping[str, int]
    device: str
    hardware: HardwareSpec
    tp: int = 1
    host_capacity_bytes: int = 0
    host: list[str] = field(default_factory=list)
    host_ready: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model in (self.device, *self.host):
            self._check_known(model)
        if self.host_capacity_bytes < 0:
            raise ValueError(f"host_capacity_bytes must be >= 0, got {self.host_capacity_bytes}")
        self.host = [m for m in self.host if m != self.device]
        self._fit_host()

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.weight_bytes)

    def _check_known(self, model: str) -> None:
        if model not in self.weight_bytes:
            raise ValueError(f"unknown model {model!r}; this instance serves "
                             f"{', '.join(sorted(self.weight_bytes))}")

    def tier(self, model: str) -> str:
        self._check_known(model)
        if model == self.device:
            return DEVICE
        return HOST if model in self.host else DISK

    def disk_time(self, model: str) -> float:
        return self.weight_bytes[model] / self.hardware.disk_bandwidth

    def link_time(self, model: str) -> float:
        return self.weight_bytes[model] / self.tp / self.hardware.host_link_bandwidth

    def load_time(self, model: str, now: float) -> float:
        """Seconds until `model` could serve if a swap to it started at `now`."""
        tier = self.tier(model)
        if tier == DEVICE:
            return 0.0
        if tier == HOST:
            return max(0.0, self.host_ready.get(model, now) - now) + self.link_time(model)
        return self.disk_time(model) + self.link_time(model)

    def activate(self, model: str, now: float) -> tuple[str, float]:
        """Make `model` the device model; returns (the tier it came from, load time).
        The outgoing model stays warm in host memory."""
        source = self.tier(model)
        seconds = self.load_time(model, now)
        if source == DEVICE:
            return source, 0.0
        outgoing, self.device = self.device, model
        if model in self.host:
            self.host.remove(model)
        self.host_ready.pop(model, None)
        self.host.append(outgoing)
        self._fit_host()
        return source, seconds

    def warm(self, model: str, now: float) -> bool:
        """Start reading a cold `model` into host memory (warm start); False if it is
        already warm or on the device, or does not fit in host memory."""
        if self.tier(model) != DISK or self.weight_bytes[model] > self.host_capacity_bytes:
            return False
        self.host.append(model)
        self.host_ready[model] = now + self.disk_time(model)
        self._fit_host(keep=model)
        return True

    def _fit_host(self, keep: str | None = None) -> None:
        """Drop least recently used warm models until the rest fit in host memory."""
        while self.host and sum(self.weight_bytes[m] for m in self.host) \
                > self.host_capacity_bytes:
            victim = next((m for m in self.host if m != keep), None)
            if victim is None:
                return
            self.host.remove(victim)
            self.host_ready.pop(victim, None)
