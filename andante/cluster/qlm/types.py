"""Input value types of the QLM core, independent of the engine's internals.

`QueuedRequest` is what QLM needs to know about a request in the global queue;
`InstanceView` is what it needs to know about one LLM serving instance (paper Def. 2.3):
which models sit on its device and in its host memory, its token capacity, its token
throughput per model (Θ of eq. 2) and its link bandwidths (model swap, §5 warm start).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting in the global queue. Times are absolute seconds on the caller's clock."""

    request_id: str
    model: str
    slo_class: str
    arrival: float
    deadline: float
    num_prompt_tokens: int
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError(f"request_id must be non-empty, got {self.request_id!r}")
        if not self.model:
            raise ValueError(f"model must be non-empty, got {self.model!r}")
        if self.num_prompt_tokens < 1:
            raise ValueError(f"num_prompt_tokens must be >= 1, got {self.num_prompt_tokens!r}")
        if self.deadline < self.arrival:
            raise ValueError(f"deadline {self.deadline!r} is before arrival {self.arrival!r}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens!r}")


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One serving instance as QLM sees it.

    `throughput` is tokens/s generated per model when that model is active (Θ, eq. 2).
    `busy_s` is the estimated time to drain the batch it is running now. Bandwidths are
    bytes/s: `host_link_bandwidth` host->device (PCIe), `disk_bandwidth` disk->host;
    `host_memory_bytes` is the host memory for warm models.
    """

    instance_id: str
    models_on_device: tuple[str, ...]
    models_on_host: tuple[str, ...]
    token_capacity: int
    throughput: Mapping[str, float]
    device_memory_bytes: int
    host_link_bandwidth: float
    disk_bandwidth: float
    num_running_tokens: int = 0
    busy_s: float = 0.0
    avg_batch_size: int = 32
    host_memory_bytes: int | None = None  # None: no limit known
    free_slots: int = 0  # batch slots free now: queued requests that start at once
    # seconds from now to the earliest expected finish among the requests running now,
    # when a slot frees with none free (None: nothing runs; the queued requests that
    # take the free slots then bound it alone)
    first_finish_s: float | None = None

    def __post_init__(self) -> None:
        if not self.instance_id:
            raise ValueError(f"instance_id must be non-empty, got {self.instance_id!r}")
        if self.token_capacity < 1:
            raise ValueError(f"token_capacity must be >= 1, got {self.token_capacity!r}")
        if self.num_running_tokens < 0:
            raise ValueError(f"num_running_tokens must be >= 0, got {self.num_running_tokens!r}")
        if self.avg_batch_size < 1:
            raise ValueError(f"avg_batch_size must be >= 1, got {self.avg_batch_size!r}")
        check_positive("host_link_bandwidth", self.host_link_bandwidth)
        check_positive("disk_bandwidth", self.disk_bandwidth)
        check_non_negative("busy_s", self.busy_s)
        if self.first_finish_s is not None:
            check_non_negative("first_finish_s", self.first_finish_s)
        if self.free_slots < 0:
            raise ValueError(f"free_slots must be >= 0, got {self.free_slots!r}")
        for model, theta in self.throughput.items():
            check_positive(f"throughput[{model!r}]", theta)

    @property
    def spare_tokens(self) -> int:
        return max(0, self.token_capacity - self.num_running_tokens)

    def tier(self, model: str) -> str:
        """'device' (active), 'host' (warm) or 'disk' (cold), per §5 model warm start."""
        if model in self.models_on_device:
            return "device"
        if model in self.models_on_host:
            return "host"
        return "disk"
