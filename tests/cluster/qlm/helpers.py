"""Small builders shared by the QLM tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from andante.cluster.instance import ModelState
from andante.cluster.load import LoadReport
from andante.cluster.qlm.types import InstanceView, QueuedRequest
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel

GB = 10**9


@dataclass(frozen=True, slots=True)
class FlatCost:
    """A cost model with a constant prefill time and a constant decode step."""

    prefill_s: float = 0.5
    step_s: float = 0.01

    def prefill_time(self, instance_id: str, model: str, num_tokens: int) -> float:
        return self.prefill_s

    def decode_time(self, instance_id: str, model: str, batch_size: int,
                    context_len: int) -> float:
        return self.step_s


def request(rid: str, model: str = "m1", slo_class: str = "interactive", arrival: float = 0.0,
            slo: float = 30.0, prompt: int = 100) -> QueuedRequest:
    return QueuedRequest(rid, model, slo_class, arrival, arrival + slo, prompt)


def view(instance_id: str = "i0", on_device: tuple[str, ...] = ("m1",),
         on_host: tuple[str, ...] = (), capacity: int = 10_000, running: int = 0,
         throughput: float = 100.0, busy_s: float = 0.0, memory: int = 80 * GB,
         models: tuple[str, ...] = ("m1", "m2", "m3")) -> InstanceView:
    return InstanceView(
        instance_id=instance_id, models_on_device=on_device, models_on_host=on_host,
        token_capacity=capacity, num_running_tokens=running,
        throughput={m: throughput for m in models}, device_memory_bytes=memory,
        host_link_bandwidth=10 * GB, disk_bandwidth=1 * GB, busy_s=busy_s, avg_batch_size=8)


def model_state(weight_bytes: Mapping[str, int], device: str = "m1",
                host: tuple[str, ...] = (), loading_s: float = 0.0,
                bandwidth: float = 1e9) -> ModelState:
    """An A100 instance holding `weight_bytes`' models (Mistral-7B's cost model each),
    `device` on its device; host link and disk at `bandwidth` bytes/s."""
    cost = CostModel(get_model("mistral-7b"), get_hardware("a100-80g"))
    return ModelState(device=device, host=host, loading_s=loading_s,
                      costs={m: cost for m in weight_bytes}, weight_bytes=dict(weight_bytes),
                      host_link_bandwidth=bandwidth, disk_bandwidth=bandwidth,
                      device_memory_bytes=80 * GB, host_memory_bytes=0, block_size=16)


@dataclass
class FakeModels:
    """A slot's multi-model handle: its model state, no warm starts."""

    state: ModelState

    def model_state(self) -> ModelState:
        return self.state

    def warm_model(self, model: str) -> bool:
        return False


@dataclass
class FakeSlot:
    """What the router reads of a controller slot."""

    load: LoadReport
    multi_model: Any
    index: int = 0
    num_in_transit: int = 0
    alive: bool = True
