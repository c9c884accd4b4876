"""The pieces of KunServe's in-process groups (andante.runtime.kunserve): options,
the form and restore reports, what rebuilds a member's executor, the executor a member
keeps while its weights serve as a stage, and the step-boundary rendezvous.

The rendezvous (KunServe §4: an operation at a step boundary of every member): each
member's thread, at its boundary, marks itself parked and waits; the leader's thread
waits until all are parked, runs the operation while no engine of the group is mid-step,
and lets them go. A member that does not arrive within the timeout cancels it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from andante.cluster.kunserve.seam import GroupPlan
from andante.engine.scheduler import Scheduler
from andante.exec.batch import StepBatch, StepResult
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.exec.torch_pipeline import STAGE_WORKER_KINDS, PipelineExecutor, StageWorkerKind
from andante.models.loader import LoadedModel
from andante.perf.cost_model import CostModel
from andante.runtime.worker import AtBoundary

if TYPE_CHECKING:
    from andante.runtime.kunserve_stages import KVExchange

log = logging.getLogger("andante.cluster")


@dataclass(frozen=True, slots=True)
class LocalGroupOptions:
    """exchange_bytes_per_step: KV bytes copied after a step that ran a batch (§4.2's
    coordinated exchange; nothing waits on the link between idle steps, so then all);
    exchange_chunk_blocks: blocks per chunk; barrier_timeout_s: how long the leader
    waits for the members to reach a step boundary; background_restore:
    `dissolve_group` returns once the restore started instead of once it is done, and
    background_prepare: `form_group` returns False while the stages are built on a
    thread, then forms the group when asked again (a server's event loop must wait
    neither for weights to reload nor to be laid out). pipelined: the group's stages run
    on their own threads with a step's microbatches in flight (andante.exec.
    torch_microbatch), else one after another on the leader's thread; lookahead: those
    microbatches are eq. (1)-balanced by KunServe's lookahead (§4.3), else cut by rows;
    stage_workers: the overlapped stages run on threads or in processes of their own
    (andante.exec.torch_pipeline_procs)."""

    exchange_bytes_per_step: int = 8 << 20
    exchange_chunk_blocks: int = 16
    barrier_timeout_s: float = 30.0
    background_restore: bool = False
    background_prepare: bool = False
    pipelined: bool = True
    lookahead: bool = True
    stage_workers: StageWorkerKind = "thread"

    def __post_init__(self) -> None:
        if self.stage_workers not in STAGE_WORKER_KINDS:
            raise ValueError(f"stage_workers must be one of {STAGE_WORKER_KINDS}, "
                             f"got {self.stage_workers!r}")
        if self.exchange_bytes_per_step < 1 or self.exchange_chunk_blocks < 1:
            raise ValueError("exchange_bytes_per_step and exchange_chunk_blocks must be >= 1")
        if not self.barrier_timeout_s > 0:
            raise ValueError(f"barrier_timeout_s must be > 0, got {self.barrier_timeout_s}")


@dataclass(slots=True)
class FormReport:
    """What forming a group did (bytes: KV copied between members, or within one)."""

    plan: GroupPlan
    seconds: float = 0.0  # the leader's boundary stall
    prepare_seconds: float = 0.0  # building the stages (while the members served)
    kv_blocks_before: dict[int, int] = field(default_factory=dict)
    kv_blocks_after: int = 0
    weight_bytes_dropped: int = 0
    num_adopted: int = 0
    num_requeued: int = 0
    num_recomputed: int = 0
    kv_bytes_exchanged: int = 0
    kv_bytes_local: int = 0
    exchange_seconds: float | None = None  # until the last chunk arrived


@dataclass(slots=True)
class RestoreReport:
    leader: int
    seconds: float = 0.0  # the leader's boundary stall
    load_seconds: float = 0.0  # rebuilding the full executors (while serving)
    weight_bytes_reloaded: int = 0
    kv_bytes_back: int = 0  # from the other members' stages
    kv_bytes_local: int = 0
    kv_blocks_before: int = 0
    kv_blocks_after: dict[int, int] = field(default_factory=dict)
    num_recomputed: int = 0
    failed_member: int | None = None


@dataclass(frozen=True, slots=True)
class Origin:
    """What rebuilds a member's unsplit executor (its weights' host copy and settings)."""

    model: LoadedModel
    options: TorchExecutorOptions
    cost_model: CostModel
    num_device_blocks: int

    @classmethod
    def of(cls, executor: TorchExecutor) -> Origin:
        """`executor`'s origin, its thread count the one it resolved (a rebuild on
        another thread must not take that thread's count)."""
        options = dataclasses.replace(executor.options, num_threads=executor.num_threads)
        return cls(executor.model, options, executor.cost_model,
                   executor.kv.num_device_blocks)

    def build(self) -> TorchExecutor:
        return TorchExecutor(self.model, self.options, self.cost_model)


@dataclass(slots=True)
class Forming:
    """What the site's steps need while the book forms (or grows) a group."""

    executors: dict[int, TorchExecutor]  # a grow: the joiners' only
    pipeline: PipelineExecutor
    origins: dict[int, Origin]
    report: FormReport
    started: float
    grown: Group | None = None  # a grow: the group before it
    relocated: dict[int, int] = field(default_factory=dict)  # a grow's block moves


@dataclass(slots=True)
class Shrinking:
    """What the site's steps need while the book shrinks a group by one."""

    group: Group
    fresh: TorchExecutor  # the leaving member's full executor, rebuilt while serving
    relocated: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Group:
    plan: GroupPlan
    executor: PipelineExecutor
    origins: dict[int, Origin]
    report: FormReport
    exchange: KVExchange | None = None
    formed_at: float = 0.0


class ReleasedExecutor:
    """The executor of a member whose weights went to its group's stage: it must not
    run (its worker forwards everything to the leader)."""

    def __init__(self, index: int, leader: int, cost_model: CostModel) -> None:
        self.index, self.leader, self.cost_model = index, leader, cost_model

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return 0, 0

    def execute(self, batch: StepBatch) -> StepResult:
        raise RuntimeError(f"instance {self.index} serves as a stage of the pipeline "
                           f"group led by instance {self.leader}")


class Rendezvous:
    """Members park at a step boundary while the leader's thread acts (module note).
    Whoever gives up first (the caller or the leader, after `timeout`) cancels the
    operation; once the leader has started it, everyone waits for its end."""

    def __init__(self, parked: Sequence[int], timeout: float) -> None:
        self._arrived = {m: threading.Event() for m in parked}
        self._started = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._cancelled = False
        self._timeout = timeout
        self.result = False

    def arrive(self, member: int) -> None:
        self._arrived[member].set()
        self._wait_for_end()

    def _wait_for_end(self) -> None:
        """Until the operation ends, or the timeout if the leader never starts it."""
        deadline = time.monotonic() + 2 * self._timeout
        while not self._done.wait(0.05):
            if not self._started.is_set() and time.monotonic() > deadline:
                with self._lock:
                    if not self._started.is_set():
                        self._cancelled = True
                        return

    def lead(self, operation: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._timeout
        try:
            arrived = all(e.wait(max(0.0, deadline - time.monotonic()))
                          for e in self._arrived.values())
            with self._lock:
                go = arrived and not self._cancelled
                if go:
                    self._started.set()
                else:
                    self._cancelled = True
            if go:
                self.result = operation()
            else:
                log.warning("kunserve: the group operation was cancelled (a member or the "
                            "leader did not reach a step boundary in %.1f s)", self._timeout)
        except Exception:
            log.exception("kunserve: group operation failed")
            self.result = False
        finally:
            self._done.set()

    def wait(self) -> bool:
        """The operation's result (False: failed or cancelled)."""
        self._wait_for_end()
        return self.result and not self._cancelled

    def parker(self, member: int) -> AtBoundary:
        return lambda _worker: self.arrive(member)

    def leader(self, operation: Callable[[], bool]) -> AtBoundary:
        return lambda _worker: self.lead(operation)


def refresh_max_num_tokens(scheduler: Scheduler) -> None:
    kv = scheduler.kv
    scheduler.max_num_tokens = min(scheduler.config.max_model_len,
                                   kv.num_device_blocks * kv.block_size)
