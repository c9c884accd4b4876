"""The Instance seam: one serving instance as the controller sees it.

Three implementations: `andante.sim.SimInstance` (an engine over a `SimExecutor` on the
simulated clock), `andante.runtime.local.LocalInstance` (an engine stepped by its own
thread in this process) and `andante.runtime.ray_actors.RayInstance` (an engine in a Ray
actor). The controller drives all of them the same way, so one `Controller` class runs
in the simulator and in the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from andante.cluster.load import LoadReport
from andante.core.request import PreemptionMode, Request
from andante.perf.cost_model import CostModel

# Operations an instance may support (its `capabilities`); the controller checks before
# asking. SWAP_MODEL exists on simulated and in-process instances (QLM); the layer
# operations are the seams KunServe will use.
SUBMIT, ABORT, WITHDRAW = "submit", "abort", "withdraw"
SWAP_MODEL = "swap_model"  # QLM: serve another model (warm from host memory or cold)
EVICT = "evict"  # QLM: preempt a running request (recompute or state swap), LSOs 2-3
DROP_LAYERS = "drop_layers"  # KunServe: free replicated layers for KV, join a pipeline
RESTORE_LAYERS = "restore_layers"  # KunServe: reload them, leave the pipeline group
EXCHANGE_KV = "exchange_kv"  # KunServe: move running requests' KV between group members
BASIC_CAPABILITIES = frozenset({SUBMIT, ABORT, WITHDRAW})


class UnsupportedOperation(NotImplementedError):
    """The instance does not implement this cluster operation."""


class Instance(Protocol):
    """Contract: every method is called from the controller's thread and returns at
    once; the effect happens at the instance's next step boundary.

    `submit(req)`: the instance takes the request; one that can never fit comes back
    finished as rejected. `abort(id)`: finish it as aborted and free its KV.
    `withdraw(ids)`: give back requests that have not started (no KV, no output): they
    reach the controller through `Controller.on_handoff` (at once in the simulator, with
    the next step message in a server); ids that cannot be withdrawn are ignored.
    `load()`: the latest `LoadReport` (the simulator computes it on demand). `alive` is
    False while the instance is down (then restarting, or dead for good).
    `evict(id, mode)`: preempt that running request at the next step boundary (its KV
    dropped, or swapped to host memory when `mode` is swap and the host tier has room).
    `swap_model`, `evict`, `drop_layers`, `restore_layers`: later cluster operations, offered
    only when named in `capabilities`; otherwise they raise `UnsupportedOperation`.
    """

    index: int
    role: str
    capabilities: frozenset[str]

    @property
    def alive(self) -> bool: ...

    def submit(self, req: Request) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def withdraw(self, request_ids: Sequence[str]) -> None: ...

    def load(self) -> LoadReport: ...

    def swap_model(self, model: str) -> None: ...

    def evict(self, request_id: str, mode: PreemptionMode) -> None: ...

    def drop_layers(self, layers: Sequence[int]) -> None: ...

    def restore_layers(self) -> None: ...


class LaterOperations:
    """Mixin: the cluster operations no instance implements yet."""

    def swap_model(self, model: str) -> None:
        raise UnsupportedOperation(f"{type(self).__name__} cannot swap its model yet")

    def evict(self, request_id: str, mode: PreemptionMode) -> None:
        raise UnsupportedOperation(f"{type(self).__name__} cannot evict requests yet")

    def drop_layers(self, layers: Sequence[int]) -> None:
        raise UnsupportedOperation(f"{type(self).__name__} cannot drop layers yet")

    def restore_layers(self) -> None:
        raise UnsupportedOperation(f"{type(self).__name__} cannot restore layers yet")


@dataclass(frozen=True, slots=True)
class ModelState:
    """Where an instance's models are (QLM §5): the one on its device, the warm ones in
    host memory, and what a router needs to estimate serving any of them there: a cost
    model per servable model, the weights' bytes and the tier bandwidths (B/s)."""

    device: str
    host: tuple[str, ...]
    loading_s: float  # seconds until the device model has loaded (0: serving)
    costs: Mapping[str, CostModel]
    weight_bytes: Mapping[str, int]
    host_link_bandwidth: float
    disk_bandwidth: float
    device_memory_bytes: int
    host_memory_bytes: int
    block_size: int


@runtime_checkable
class MultiModel(Protocol):
    """An instance that reports its models (`model_state`) and loads one into host
    memory ahead of need (`warm_model`, QLM's warm start; False when it cannot)."""

    def model_state(self) -> ModelState: ...

    def warm_model(self, model: str) -> bool: ...


@runtime_checkable
class HandsOff(Protocol):
    """A policy that picks requests to hand back to the controller (Ascendra's LP
    offload). `take_handoffs()` returns (and forgets) the ids picked since last asked;
    the instance withdraws them after the step that picked them."""

    def take_handoffs(self) -> list[str]: ...


def fresh_copy(req: Request) -> Request:
    """The request as it arrived (no output, no KV): for re-queueing it elsewhere after
    its instance died. Its identity, prompt, sampling, arrival and objectives are kept."""
    return Request(
        request_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
        sampling=req.sampling, arrival_time=req.arrival_time, priority=req.priority,
        model=req.model, slo=req.slo, prefix_ids=req.prefix_ids,
    )
