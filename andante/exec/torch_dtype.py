"""The serving dtype of this machine: measured speed and greedy agreement with float32.

Design note (issue 32.4). bfloat16 was the default wherever oneDNN has bf16 GEMMs, and
float32 elsewhere, by rule; how much bf16 gains depends on the CPU (AMX, AVX-512 BF16
without AMX, or neither), and how often its greedy answers leave float32's depends on
the model's near-ties. So `--dtype auto` measures both on this machine, once:

1. Quality: greedy decoding of QUALITY_PROMPTS (QUALITY_TOKENS tokens each) in both
   dtypes; the agreement is the share of the float32 tokens that bf16 reproduces before
   its first divergence, over all prompts (1.0: identical answers).
2. Speed: the same load in both dtypes, interleaved rounds (a burst of outside load hits
   both alike), medians: a SPEED_PREFILL-token prefill (the prompts' tokens, cycled) and
   SPEED_DECODE_STEPS decode steps of SPEED_BATCH requests; the cost is the time of a
   request's prefill plus its decode steps (one prefill, then a batch decoding, as a
   served request sees them).

bfloat16 is chosen when its agreement is at least MIN_AGREEMENT and it is at least
MIN_SPEEDUP times faster; otherwise float32 (exact). Both run on one thread: the dtypes'
speed ratio is the kernels', and two OpenMP threads beside a busy neighbour collapse
(6-38x slower steps), which would make the start-up measurement take minutes on a shared
machine. The choice is cached per machine under the andante home (`dtype/<digest>.json`,
keyed by CPU model, torch version and the model file), measured and cached only on an
idle machine (other processes' CPU share below IDLE_OTHERS_SHARE, from /proc/stat: a
half-second look before, and the whole measurement; andante.exec.cpu_share): beside
other work it took 6.5 minutes here and its timings were noise (others' share 0.97), so
a busy start-up serves bf16 (the rule where the CPU has bf16 GEMMs, as vLLM serves this
model) for that run and measures at a later, quiet start. A CPU without oneDNN bf16
GEMMs gets float32 without a measurement (bf16 would be emulated in float32, slower).
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from andante.core import Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.cpu_share import IDLE_OTHERS_SHARE, CpuTimes, measure_others_share
from andante.exec.torch_threads import cpu_model
from andante.perf.paths import andante_home, write_json_atomically

log = logging.getLogger(__name__)

DTYPE_VERSION = 1
QUALITY_PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give a synonym for 'happy'.",
    "Name the largest planet in the solar system.",
)
QUALITY_TOKENS = 16
SPEED_PREFILL = 128
SPEED_BATCH = 8
SPEED_DECODE_STEPS = 8
SPEED_ROUNDS = 3
QUIET_CHECK_S = 0.5
#: The agreement guards against a bf16 path that derails answers early (a broken kernel
#: agrees ~0); flips at near-ties later in an answer are bf16's nature (vLLM serves it):
#: measured here, 0.86 over the eight prompts.
MIN_AGREEMENT = 0.6
MIN_SPEEDUP = 1.1


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str
    agreement: float  # bf16's share of float32's greedy tokens before divergence
    ms: dict[str, float]  # dtype -> a request's prefill + its decode steps (ms)
    source: str = "measured"

    def describe(self) -> str:
        times = ", ".join(f"{d} {t:.0f} ms" for d, t in self.ms.items())
        return (f"dtype {self.dtype} (greedy agreement of bf16 with float32 "
                f"{self.agreement:.2f}; prefill + {SPEED_DECODE_STEPS} decode steps: {times}; "
                f"{self.source})")


def decide(agreement: float, ms: dict[str, float]) -> str:
    """bfloat16 when it agrees enough with float32 and is enough faster."""
    fast_enough = ms["bfloat16"] * MIN_SPEEDUP <= ms["float32"]
    return "bfloat16" if agreement >= MIN_AGREEMENT and fast_enough else "float32"


def prefix_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> float:
    """The share of `reference`'s tokens that `other` reproduces before its first
    divergence, over all answers."""
    total = sum(len(r) for r in reference)
    same = 0
    for ref, out in zip(reference, other, strict=True):
        for a, b in zip(ref, out, strict=False):
            if a != b:
                break
            same += 1
    return same / total if total else 1.0


class _Probe:
    """Greedy answers and step timings of one executor (anything with `execute`)."""

    def __init__(self, executor: Any, block_size: int) -> None:
        self.executor = executor
        self.block_size = block_size

    def _table(self, num_tokens: int, first: int = 0) -> list[int]:
        return list(range(first, first - (-num_tokens // self.block_size)))

    def greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
        req = Request("dtype-probe", prompt, params, 0.0)
        table = self._table(len(prompt) + num_tokens)
        batch = StepBatch()
        batch.add(req, len(prompt), 0, True, table)
        for step in range(num_tokens):
            token = self.executor.execute(batch).sampled_token_ids[0]
            req.append_output_token(int(token), 0.0)
            batch = StepBatch()
            batch.add(req, 1, len(prompt) + step, True, table)
        return list(req.output_token_ids)

    def timed_ms(self, prompt: list[int]) -> float:
        """A SPEED_PREFILL-token prefill of `prompt` (SPEED_PREFILL + 1 tokens), then
        SPEED_DECODE_STEPS decode steps of SPEED_BATCH requests."""
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        table = self._table(SPEED_PREFILL + 1)
        prefill = StepBatch()
        prefill.add(Request("dtype-prefill", prompt, params, 0.0), SPEED_PREFILL, 0, True,
                    table)
        decode = StepBatch()
        for i in range(SPEED_BATCH):
            decode.add(Request(f"dtype-decode-{i}", prompt, params, 0.0), 1, SPEED_PREFILL,
                       True, table)
        started = time.perf_counter()
        self.executor.execute(prefill)
        for _ in range(SPEED_DECODE_STEPS):
            self.executor.execute(decode)
        return (time.perf_counter() - started) * 1e3


def measure_dtype_choice(executors: dict[str, Any], prompts: list[list[int]],
                         block_size: int) -> DtypeChoice:
    """Greedy agreement and interleaved timings of a "float32" and a "bfloat16"
    executor; the choice `decide` makes from them."""
    probes = {dtype: _Probe(ex, block_size) for dtype, ex in executors.items()}
    answers = {d: [p.greedy(list(prompt), QUALITY_TOKENS) for prompt in prompts]
               for d, p in probes.items()}
    agreement = prefix_agreement(answers["float32"], answers["bfloat16"])
    tokens = [t for prompt in prompts for t in prompt]
    speed_prompt = [tokens[i % len(tokens)] for i in range(SPEED_PREFILL + 1)]
    samples: dict[str, list[float]] = {d: [] for d in probes}
    for p in probes.values():  # a warm-up each
        p.timed_ms(speed_prompt)
    for _ in range(SPEED_ROUNDS):
        for d, p in probes.items():
            samples[d].append(p.timed_ms(speed_prompt))
    ms = {d: round(statistics.median(s), 1) for d, s in samples.items()}
    return DtypeChoice(decide(agreement, ms), round(agreement, 3), ms)


def dtype_key(model_path: Path) -> dict[str, Any]:
    """Everything the choice depends on: the machine, torch, the model file."""
    try:
        stat = model_path.stat()
        model = {"path": str(model_path.resolve()), "size": stat.st_size,
                 "mtime": int(stat.st_mtime)}
    except OSError:
        model = {"path": str(model_path)}
    return {"version": DTYPE_VERSION, "cpu": cpu_model(), "torch": torch.__version__,
            "model": model}


def _cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return andante_home() / "dtype" / f"{digest}.json"


def _load(path: Path, key: dict[str, Any]) -> DtypeChoice | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry["key"] != key or entry["dtype"] not in ("bfloat16", "float32"):
            return None
        return DtypeChoice(entry["dtype"], float(entry["agreement"]),
                           {str(k): float(v) for k, v in entry["ms"].items()},
                           f"cached {path}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def cached_dtype_choice(measure: Callable[[], DtypeChoice], key: dict[str, Any],
                        fallback: str, cpu_times: Callable[[], CpuTimes | None] | None = None,
                        sleep: Callable[[float], None] = time.sleep) -> DtypeChoice:
    """The cached choice for `key`; else, on an idle machine (others' CPU share over a
    QUIET_CHECK_S look below IDLE_OTHERS_SHARE), `measure()`, cached when the machine
    stayed idle while it ran. Beside other work the timings mean little and take
    minutes, so `fallback` (the rule's dtype) serves this run, not cached."""
    path = _cache_path(key)
    cached = _load(path, key)
    if cached is not None:
        return cached
    if cpu_times is None:
        from andante.exec.cpu_share import read_cpu_times

        cpu_times = read_cpu_times
    _, before = measure_others_share(lambda: sleep(QUIET_CHECK_S), cpu_times)
    if before is None or before >= IDLE_OTHERS_SHARE:
        beside = "unmeasurable" if before is None else f"{before:.2f}"
        return DtypeChoice(fallback, 0.0, {}, f"not measured beside other work (others' CPU "
                           f"share {beside}): the rule's choice, not cached")
    choice, share = measure_others_share(measure, cpu_times)
    if share is None or share >= IDLE_OTHERS_SHARE:
        return DtypeChoice(choice.dtype, choice.agreement, choice.ms, "measured beside other "
                           f"work (others' CPU share {share}), not cached")
    entry = {"key": key, **asdict(choice), "others_cpu_share": round(share, 3)}
    try:
        write_json_atomically(path, entry)
    except OSError as exc:
        log.warning("dtype: cannot cache the choice in %s (%s)", path, exc)
    return DtypeChoice(choice.dtype, choice.agreement, choice.ms,
                       f"measured (others' CPU share {share:.2f}), cached in {path}")


def serving_dtype(model_path: str | None) -> DtypeChoice:
    """`--dtype auto`: float32 where the CPU has no oneDNN bf16 GEMMs (bf16 would be
    emulated, slower than float32), else the measured and cached choice."""
    from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
    from andante.exec.torch_layers import packed_gemm_supported
    from andante.models.loader import load_model, resolve_model_path

    if not packed_gemm_supported(torch.bfloat16):
        return DtypeChoice("float32", 0.0, {}, "no oneDNN bf16 GEMMs on this CPU")
    block_size = 16

    def measure() -> DtypeChoice:
        model = load_model(model_path, "float32")
        prompts = [model.tokenizer.encode(p) for p in QUALITY_PROMPTS]
        before = torch.get_num_threads()
        try:
            executors = {d: TorchExecutor(model, TorchExecutorOptions(
                dtype=d, num_threads=1, kv_cache_gib=0.05, swap_space_gib=0.0,
                block_size=block_size, parallel_min_tokens=None, warmup_tokens=None))
                for d in ("float32", "bfloat16")}
            return measure_dtype_choice(executors, prompts, block_size)
        finally:
            torch.set_num_threads(before)

    return cached_dtype_choice(measure, dtype_key(resolve_model_path(model_path)), "bfloat16")
