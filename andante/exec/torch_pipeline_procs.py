"""Pipeline stages in processes of their own: a pipeline group's stages run at once,
not one at a time under the interpreter lock (KunServe §4.3, §5 on this CPU).

Design note. `ProcessStageStream` is andante.exec.torch_microbatch's `StageStream` with
one spawned process per stage instead of one thread: microbatches flow through the
stages in order (stage k on microbatch m while stage k+1 runs m - 1) and the caller is
told when each leaves stage 0 and the last stage. A stage process builds its stage from
the parent stage's KV pools, moved to shared memory (`share_memory_`, in place: the
parent's tensors and every view of them see the same bytes), and from a copy of the
model holding shared-memory clones of the weights that stage uses (`stage_model`; the
serving model is never touched: while a group forms, its members still serve on it from
other threads; a packed bf16 GEMM weight is the process's own, packed there), so what the group
does between steps on the parent's side (swaps, the chunked KV exchange, `regroup`, the
copy back at a restore) reads and writes the very pools the stage processes compute on;
the overlapped loop runs those with no microbatch in flight, or on blocks no microbatch
in flight touches. A
microbatch's inputs and the hidden states between stages go through pipes, their
tensors as raw bytes (`pack` / `unpack`); the first stage also gets no hidden states,
the last returns the sampled rows' logits, and the parent samples. Each message carries
the stage-seconds and the activation bytes of its microbatch, so the parent keeps the
same `PipelineTimes` as with threads. A stage's error is sent to the parent and raised
by `next_event`; so is a stage process's death, at once (the parent waits on the
processes' sentinels too, and keeps no copy of the children's pipe ends, so a dead
stage's neighbours see their pipes break). Starting the processes imports torch in
each (seconds): it happens at the first microbatch, or ahead with `start`.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.multiprocessing as mp

from andante.exec.torch_microbatch import PipelineTimes
from andante.models.weights import LayerWeights, ModelWeights

if TYPE_CHECKING:
    from andante.exec.torch_executor import TorchExecutorOptions
    from andante.exec.torch_kv import KVPools
    from andante.models.loader import LoadedModel


class Stage(Protocol):
    """What a stage process is built from and runs (andante.exec.torch_pipeline's
    `PipelineStage`; its class is passed in, so this module does not import it)."""

    layers_range: tuple[int, int]
    kv: KVPools
    max_len: int
    epilogues: bool

    def forward(self, hidden: torch.Tensor | None, inputs: Any) -> torch.Tensor: ...

_STOP = b"stop"
_JOIN_S = 10.0


def _rebuild(raw: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
        torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return _rebuild, (raw, t.dtype, tuple(t.shape))
        return NotImplemented


def pack(obj: Any) -> bytes:
    """`obj` pickled with its tensors as raw bytes (no shared-memory file per tensor)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def unpack(raw: bytes) -> Any:
    return pickle.loads(raw)


def share(obj: Any) -> None:
    """Move every tensor reachable from `obj` to shared memory, in place."""
    for value in _tensors(obj):
        value.share_memory_()


def stage_model(model: LoadedModel, layers: tuple[int, int]) -> LoadedModel:
    """A copy of `model` whose weights are clones, in shared memory, of what a stage of
    `layers` builds from (its layers; the embedding if first; the final norm and LM
    head if last), the others empty (the layer list keeps its length)."""
    weights, (start, end) = model.weights, layers
    first, last = start == 0, end == len(weights.layers)
    empty = torch.empty(0, dtype=weights.dtype)
    unused = LayerWeights(empty, empty, None, empty, empty, empty, empty)
    kept = [_shared_clone_layer(w) if start <= i < end else unused
            for i, w in enumerate(weights.layers)]
    embed = _shared_clone(weights.embed) if first else empty
    tied = weights.lm_head is weights.embed
    lm_head = empty if not last else embed if tied and first else \
        _shared_clone(weights.lm_head)
    norm = _shared_clone(weights.final_norm) if last else empty
    factors = weights.rope_freq_factors
    return dataclasses.replace(model, weights=ModelWeights(
        embed, kept, norm, lm_head, None if factors is None else _shared_clone(factors)))


def _shared_clone_layer(w: LayerWeights) -> LayerWeights:
    return LayerWeights(
        input_norm=_shared_clone(w.input_norm), qkv=_shared_clone(w.qkv),
        qkv_bias=None if w.qkv_bias is None else _shared_clone(w.qkv_bias),
        o_proj=_shared_clone(w.o_proj), post_norm=_shared_clone(w.post_norm),
        gate_up=_shared_clone(w.gate_up), down=_shared_clone(w.down))


def _shared_clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone().share_memory_()


def _tensors(obj: Any, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from `obj`'s attributes (lists, dicts, objects)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item, seen)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item, seen)]
    fields = getattr(obj, "__dict__", None)
    slots = getattr(type(obj), "__slots__", ())
    values = list(fields.values()) if fields else []
    values += [getattr(obj, s) for s in slots if hasattr(obj, s)]
    if isinstance(obj, torch.nn.Module) or type(obj).__module__.startswith("andante."):
        return [t for item in values for t in _tensors(item, seen)]
    return []


def _stage_main(k: int, build: Callable[..., Stage], model: LoadedModel,
                options: TorchExecutorOptions, layers: tuple[int, int], kv: KVPools,
                max_len: int, epilogues: bool, inbox: Connection, outbox: Connection | None,
                events: Connection) -> None:
    """A stage process: build the stage over the shared weights and KV pools, then
    take microbatches in order, run the stage, pass them on."""
    assert options.num_threads is not None  # (`ProcessStageStream` sets it)
    torch.set_num_threads(options.num_threads)
    stage = build(model, options, layers, 0, 0, max_len, epilogues, kv)
    last = outbox is None
    with torch.inference_mode():
        while True:
            raw = inbox.recv_bytes()
            if raw == _STOP:
                if outbox is not None:
                    outbox.send_bytes(_STOP)
                return
            index, hidden, inputs, busy, moved = unpack(raw)
            if hidden is not None:
                moved += hidden.numel() * hidden.element_size()
            began = time.perf_counter()
            try:
                out = stage.forward(hidden, inputs)
            except BaseException as exc:  # raised by the parent's next_event
                events.send_bytes(pack(("error", k, repr(exc))))
                continue
            busy = [*busy, time.perf_counter() - began]
            if k == 0:
                events.send_bytes(pack(("stage0", index)))
            if last:
                events.send_bytes(pack(("done", index, out, busy, moved)))
            else:
                assert outbox is not None
                outbox.send_bytes(pack((index, out, inputs, busy, moved)))


class ProcessStageStream:
    """`StageStream`'s interface over one process per stage (see the module note)."""

    def __init__(self, model: LoadedModel, options: TorchExecutorOptions,
                 stages: Sequence[Stage], times: PipelineTimes, threads: int) -> None:
        """`threads`: each stage process's intra-op threads (`PipelineExecutor`'s
        resolved count per stage: its share of the executor's threads, the stages
        running at once on the same cores, andante.exec.torch_microbatch's
        `stage_threads`, unless `threads_per_stage` says otherwise)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.stages = list(stages)
        self.num_stages = len(self.stages)
        self.model = model
        self.options = dataclasses.replace(options, num_threads=threads)
        self.times = times
        self.activation_bytes = 0
        self.num_activation_transfers = 0
        self._feed: Connection | None = None
        self._events: list[Connection] = []
        self._procs: list[Any] = []
        self._links: list[Connection] = []
        self._models: list[LoadedModel] = []  # each stage's shared weights (`stage_model`)

    def start(self) -> None:
        """Spawn the stage processes (imports torch in each: seconds)."""
        if self._procs:
            return
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe(duplex=False) for _ in range(self.num_stages)]  # (recv, send)
        event_pipes = [ctx.Pipe(duplex=False) for _ in range(self.num_stages)]
        for stage in self.stages:
            share(stage.kv)
        # the stages' weights: clones, kept until `close` (the processes map them)
        self._models = [stage_model(self.model, stage.layers_range) for stage in self.stages]
        for k, stage in enumerate(self.stages):
            outbox = pipes[k + 1][1] if k + 1 < self.num_stages else None
            proc = ctx.Process(target=_stage_main, name=f"andante-stage-{k}", daemon=True,
                               args=(k, type(stage), self._models[k], self.options,
                                     stage.layers_range,
                                     stage.kv, stage.max_len, stage.epilogues, pipes[k][0],
                                     outbox, event_pipes[k][1]))
            proc.start()
            self._procs.append(proc)
        self._feed = pipes[0][1]
        self._events = [recv for recv, _ in event_pipes]
        self._links = [self._feed, *self._events]
        # the children's ends, closed here: a dead stage's pipes break (EOF, EPIPE)
        children = [recv for recv, _ in pipes] + [send for _, send in pipes[1:]]
        for conn in children + [send for _, send in event_pipes]:
            conn.close()

    def feed(self, index: int, item: Any) -> None:
        """Microbatch `index` (its `StepInputs`) enters stage 0."""
        self.start()
        assert self._feed is not None
        self._feed.send_bytes(pack((index, None, item, [], 0)))

    def next_event(self) -> tuple[int, bool, Any]:
        """(microbatch index, whether it left the last stage, the logits or None)."""
        sentinels = [p.sentinel for p in self._procs]
        while True:
            ready = wait([*self._events, *sentinels], timeout=60.0)
            events = [c for c in self._events if c in ready]
            if not events:  # a stage's process ended (or none answered in a minute)
                self._raise_if_dead()
                continue
            # the earliest stage first: a microbatch's stage-0 event precedes its last
            conn = events[0]
            try:
                message = unpack(conn.recv_bytes())
            except EOFError:  # its process is gone
                self._raise_if_dead(wait_s=_JOIN_S)
                raise RuntimeError("a pipeline stage process closed its events") from None
            kind = message[0]
            if kind == "error":
                raise RuntimeError(f"pipeline stage {message[1]} failed: {message[2]}")
            if kind == "stage0":
                return message[1], False, None
            _, index, logits, busy, moved = message
            self._account(busy, moved)
            return index, True, logits

    def _raise_if_dead(self, wait_s: float = 0.0) -> None:
        """Raise if a stage's process has ended (waiting up to `wait_s` for one to)."""
        if wait_s:
            wait([p.sentinel for p in self._procs], timeout=wait_s)
        dead = [f"{p.name} (exit code {p.exitcode})" for p in self._procs
                if p.exitcode is not None]
        if dead:
            raise RuntimeError(f"pipeline stage process(es) {', '.join(dead)} died")

    def _account(self, busy: list[float], moved: int) -> None:
        times = self.times
        for k, seconds in enumerate(busy):
            times.busy += seconds
            times.per_stage[k] += seconds
        self.activation_bytes += moved
        self.num_activation_transfers += self.num_stages - 1

    def close(self) -> None:
        """Stop the processes once what was fed has gone through."""
        if not self._procs:
            return
        try:
            if self._feed is not None:  # (None: `start` failed part way)
                self._feed.send_bytes(_STOP)
        except OSError:
            pass
        for proc in self._procs:
            proc.join(_JOIN_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(_JOIN_S)
        for conn in self._links:
            conn.close()
        self._procs, self._events, self._links, self._feed = [], [], [], None
        self._models = []
