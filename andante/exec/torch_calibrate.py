"""Calibrate the cost model on this machine: time real steps, fit, save a profile.

Design note. Ascendra §5.1 predicts a step's latency from its roofline terms
tM = bytes / bandwidth and tF = FLOPs / peak with coefficients fitted by least squares
on measured steps (andante.perf.fit, non-negative, relative error; the steps the
executor runs on one thread get their own set, and a KV-read term: `fit_by_threads`).
The sweep runs the real TorchExecutor on synthetic batches of every kind the scheduler
produces: whole prefills, decode batches at several contexts, and mixed prefill +
decode steps. Every step with a prefill runs twice at a token count not run before,
each time after an untimed one-sequence decode step, as a prompt arrives among decode
steps in live serving: the first run is cold (oneDNN builds the GEMM primitives of that
size), the second warm. A step of whole prefills alone is what an idle engine runs
when a prompt arrives (a served prefill-only step follows an idle wait: no request was
running), so those runs also start after `idle_before_prefill` seconds of idling, the
state serving meets them in, whatever the OpenMP wait policy does with it: with
libgomp's default (spinning) policy the worker has stopped spinning by then and the
step pays to wake it, 3-5% more on a 150-token prefill (2 threads, quiet moments of a
shared machine), and a quiet fidelity run's served prefill-only steps took a median
1.04x the prediction timed right after a decode step where its other steps took 1.00x;
with OMP_WAIT_POLICY=PASSIVE the idle wait cost nothing measurable there (0.96x), and
on a loaded machine 1.2-1.4x in every trial (the process waits to be scheduled again).
The regression is fitted to the warm runs, the steady state of a serving engine, and
the cold-minus-warm differences give the setup of a new step size (`fit_new_size`,
andante.perf.step_sizes), which the simulator adds the first time an instance runs a
size. (Fitting the cold runs alone, as before, made the model predict
served prefills 14-18% high once their sizes had run.)
The roofline rates themselves are measured too (a large bf16 GEMM for peak FLOP/s, a large
copy for memory bandwidth, a KV swap for the host-link rate), so the fitted
coefficients stay near 1 and the profile remains interpretable.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from andante.core.request import Request, SyntheticTokens
from andante.core.sampling import SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.torch_cost import CPU_PROFILE
from andante.exec.torch_executor import TorchExecutor
from andante.kv.block_manager import KVBlockManager
from andante.perf.cost_model import CostModel
from andante.perf.fit import Sample, fit_by_threads, fit_new_size, prediction_error
from andante.perf.shape import BatchShape
from andante.perf.specs import HardwareSpec
from andante.perf.step_sizes import ONEDNN_PRIMITIVE_CACHE, default_cache_sizes

Chunks = tuple[tuple[int, int], ...]  # (new tokens, cached tokens) per request
NewSize = tuple[int, float]  # (token count, seconds a cold run took over a warm one)

#: oneDNN's primitive cache size, where the environment sets it (its default otherwise).
PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
#: Token counts between the repeats of one prefill shape (no repeat meets another's).
FRESH_STRIDE = 5


@dataclass(frozen=True, slots=True)
class SweepConfig:
    prefill_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024)
    decode_batches: tuple[int, ...] = (1, 4, 8, 16, 32)
    decode_contexts: tuple[int, ...] = (64, 256, 1024)
    mixed: tuple[tuple[int, int, int], ...] = ((64, 4, 128), (256, 8, 256), (128, 16, 512))
    repeats: int = 3
    idle_before_prefill: float = 0.1  # seconds idle before each timed prefill-only step

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not self.idle_before_prefill >= 0:
            raise ValueError(f"idle_before_prefill must be >= 0 seconds, "
                             f"got {self.idle_before_prefill!r}")

    def shapes(self) -> list[Chunks]:
        out: list[Chunks] = [((n, 0),) for n in self.prefill_lens]
        out += [((1, ctx),) * b for b in self.decode_batches for ctx in self.decode_contexts]
        out += [((p, 0),) + ((1, ctx),) * b for p, b, ctx in self.mixed]
        return out


# Six decode shapes, small and large batches: steps in both thread regimes.
QUICK_SWEEP = SweepConfig(prefill_lens=(32, 128), decode_batches=(1, 2, 4, 8, 16, 32),
                          decode_contexts=(32, 96), mixed=((32, 2, 64),), repeats=1)


@dataclass(slots=True)
class Calibration:
    """The fitted profile; the warm steps it was fitted to, with its mean |relative error|
    over them; and the cold-minus-warm pairs the new-size setup was fitted to."""

    hardware: HardwareSpec
    samples: list[Sample] = field(default_factory=list)
    error: float = 0.0  # mean absolute relative error of the fitted model
    new_sizes: list[NewSize] = field(default_factory=list)


#: The untimed step before each timed step with a prefill (`_measure_shape`).
LEAD_IN_DECODE: Chunks = ((1, 32),)


def synthetic_batch(kv: KVBlockManager, chunks: Chunks, tag: str,
                    token_id: int = 1000) -> StepBatch:
    """A step of synthetic requests (prompt = `token_id` repeated), KV allocated in `kv`."""
    batch = StepBatch()
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    for i, (new, cached) in enumerate(chunks):
        rid = f"{tag}-{i}"
        req = Request(rid, SyntheticTokens(new + cached, token_id), params, 0.0)
        kv.allocate(rid, new + cached)
        batch.requests.append(req)
        batch.num_new_tokens.append(new)
        batch.num_cached_tokens.append(cached)
        batch.samples.append(True)
        batch.block_tables.append(kv.block_table(rid))
    return batch


def _fresh_lengths(chunks: Chunks, repeat: int) -> Chunks:
    """`chunks` with its prefill chunks lengthened by 1 + FRESH_STRIDE * `repeat` tokens:
    a step size the sweep has not run yet (none of its other shapes has that count)."""
    return tuple((n + 1 + FRESH_STRIDE * repeat if n > 1 else n, c) for n, c in chunks)


def _time_once(executor: TorchExecutor, kv: KVBlockManager, chunks: Chunks, tag: str,
               token_id: int) -> Sample:
    batch = synthetic_batch(kv, chunks, tag, token_id)
    try:
        return batch.shape(), executor.execute(batch).duration
    finally:
        for req in batch.requests:
            kv.free(req.request_id)


@dataclass(frozen=True, slots=True)
class LeadIn:
    """What precedes each timed step with a prefill: an untimed one-sequence decode
    step, then, before a step of whole prefills alone, `idle` seconds of `pause`."""

    idle: float = 0.0
    pause: Callable[[float], None] = time.sleep

    def run(self, executor: TorchExecutor, kv: KVBlockManager, chunks: Chunks, tag: str,
            token_id: int) -> None:
        _time_once(executor, kv, LEAD_IN_DECODE, tag, token_id)
        if self.idle > 0 and all(n > 1 for n, _ in chunks):
            self.pause(self.idle)


def _measure_shape(executor: TorchExecutor, kv: KVBlockManager, chunks: Chunks, tag: str,
                   repeats: int, token_id: int, lead_in: LeadIn = LeadIn()
                   ) -> tuple[list[Sample], list[NewSize]]:
    """Decode-only steps: the median of `repeats` warm runs of one shape (decode batch
    sizes recur in live serving). Steps with a prefill, per repeat: a new size
    (`_fresh_lengths`) run cold, then warm, each after `lead_in`: an untimed
    one-sequence decode step, as in live serving, where a prompt arrives among decode
    steps (on a CPU those run on one thread: the step after them pays for waking the
    others), and before whole prefills alone an idle wait, as a prompt that finds the
    engine idle; the warm run is the sample, cold minus warm the new size's setup."""
    if all(n == 1 for n, _ in chunks):
        _time_once(executor, kv, chunks, tag, token_id)  # warm-up
        runs = [_time_once(executor, kv, chunks, tag, token_id) for _ in range(repeats)]
        return [(runs[0][0], float(statistics.median(d for _, d in runs)))], []
    samples: list[Sample] = []
    new_sizes: list[NewSize] = []
    for r in range(repeats):
        fresh = _fresh_lengths(chunks, r)
        lead_in.run(executor, kv, fresh, f"{tag}-{r}-lead", token_id)
        _, cold = _time_once(executor, kv, fresh, f"{tag}-{r}-cold", token_id)
        lead_in.run(executor, kv, fresh, f"{tag}-{r}-lead", token_id)
        shape, warm = _time_once(executor, kv, fresh, f"{tag}-{r}", token_id)
        samples.append((shape, warm))
        new_sizes.append((shape.num_tokens, cold - warm))
    return samples, new_sizes


def measure_steps(executor: TorchExecutor, shapes: Sequence[Chunks], repeats: int,
                  progress: Callable[[int, int], None] | None = None,
                  lead_in: LeadIn = LeadIn()) -> tuple[list[Sample], list[NewSize]]:
    """(shape, seconds) samples of synthetic warm steps, and (token count, cold minus
    warm seconds) of the new sizes; skips shapes that do not fit."""
    block_size = executor.options.block_size
    kv = KVBlockManager(block_size, *executor.num_kv_blocks(block_size), watermark=0.0)
    token_id = min(1000, executor.model.config.vocab_size - 1)
    samples: list[Sample] = []
    new_sizes: list[NewSize] = []
    warmed = False
    for index, chunks in enumerate(shapes):
        longest = max(_fresh_lengths(chunks, repeats), key=lambda nc: nc[0] + nc[1])
        need = sum(kv.num_blocks_for(n + c) for n, c in _fresh_lengths(chunks, repeats))
        if need > kv.num_device_blocks or sum(longest) > executor.max_model_len:
            continue
        if not warmed:  # the first forward pass of the process pays one-time costs
            _time_once(executor, kv, chunks, "warm-up", token_id)
            warmed = True
        measured, extra = _measure_shape(executor, kv, chunks, f"cal{index}", repeats,
                                         token_id, lead_in)
        samples += measured
        new_sizes += extra
        if progress is not None:
            progress(index + 1, len(shapes))
    return samples, new_sizes


def _best_of(run: Callable[[], object], repeats: int = 3) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def measure_rates(executor: TorchExecutor) -> tuple[float, float, float]:
    """(peak FLOP/s of a bf16 GEMM, memory bytes/s of a copy, KV swap bytes/s)."""
    with torch.inference_mode():
        a = torch.randn(1024, 2048).to(executor.dtype)
        b = torch.randn(2048, 2048).to(executor.dtype)
        flops = 2 * 1024 * 2048 * 2048 / _best_of(lambda: torch.mm(a, b))
        src = torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        bandwidth = 2 * src.numel() / _best_of(lambda: dst.copy_(src))
    pools = executor.kv
    n = min(64, pools.num_device_blocks, pools.num_host_blocks)
    if n == 0:
        return flops, bandwidth, bandwidth / 2
    pairs = [(i, i) for i in range(n)]

    def swap_out() -> None:
        pools.swap(pairs, [])

    seconds = _best_of(swap_out)
    block_bytes = pools.device[:, :, 0].numel() * pools.device.element_size()
    return flops, bandwidth, n * block_bytes / seconds


def serial_below_tokens(executor: TorchExecutor) -> int | None:
    """Steps below this many tokens run on one thread (None: all on the same threads)."""
    if executor.num_threads <= 1:
        return None
    return executor.thread_choice.parallel_min_tokens


def total_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def primitive_cache_sizes() -> int:
    """The step sizes the engine's primitive cache holds (andante.perf.step_sizes)."""
    value = os.environ.get(PRIMITIVE_CACHE_ENV, "")
    try:
        return default_cache_sizes(int(value) if value else ONEDNN_PRIMITIVE_CACHE)
    except ValueError:
        return default_cache_sizes()


def calibrate(executor: TorchExecutor, sweep: SweepConfig | None = None,
              name: str = CPU_PROFILE,
              progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Measure, fit and return a hardware profile named `name` (not saved)."""
    sweep = sweep or SweepConfig()
    flops, bandwidth, link = measure_rates(executor)
    base = HardwareSpec(name=name, peak_flops=flops, mem_bandwidth=bandwidth,
                        mem_capacity=total_memory_bytes(), host_link_bandwidth=link,
                        interconnect_bandwidth=link, collective_latency=0.0)
    samples, new_sizes = measure_steps(executor, sweep.shapes(), sweep.repeats, progress,
                                       LeadIn(sweep.idle_before_prefill))
    if not samples:
        raise ValueError("no calibration step fits this executor's KV cache")
    below = serial_below_tokens(executor)
    coefficients, serial = fit_by_threads(CostModel(executor.spec, base), samples, below)
    fixed, per_token = fit_new_size(new_sizes)
    fitted = dataclasses.replace(
        base, coefficients=coefficients, serial_coefficients=serial,
        serial_below_tokens=below if serial is not None else None,
        new_size_fixed=fixed, new_size_per_token=per_token,
        new_size_cache=primitive_cache_sizes() if fixed or per_token else 0)
    error = prediction_error(CostModel(executor.spec, fitted), samples)
    return Calibration(fitted, samples, error, new_sizes)


def describe(shape: BatchShape) -> str:
    return (f"{shape.num_seqs} seqs, {shape.num_tokens} tokens, "
            f"{shape.kv_tokens_read} KV read")
