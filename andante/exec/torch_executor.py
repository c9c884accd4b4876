"""TorchExecutor: the real backend of the Executor protocol (DESIGN.md rule 2).

One `execute` call is one engine step: swaps (timed), then one fused forward pass over
every scheduled token of the batch (andante.exec.torch_inputs / torch_model), then
sampling of the rows whose request produces a token. KV lives in preallocated pools
sized from `kv_cache_gib` (device tier) and `swap_space_gib` (host tier). Steps with
fewer than `parallel_min_tokens` tokens run on one thread; by default that threshold is
measured at start-up (andante.exec.torch_threads): whether a second OpenMP thread pays
for small decode steps depends on the machine and its load. The measured choice is
cached per machine and model shape (andante.exec.torch_threads), so only the first
start-up pays for the probe; it is logged either way. While serving, each step size's
thread count keeps following the CPU the engine gets (andante.exec.thread_adapter:
re-probed on the served steps when their times drift, and now and then). Decode rows'
attention takes the faster of two paths on this CPU, timed at start-up
(andante.exec.torch_attention.choose_decode_path). The process
keeps freed heap memory for the next step (andante.exec.malloc_tuning). On the fused
bf16 path each step's GEMM rows are padded to a step-size bucket and every bucket up to
the step budget is run once at start-up (andante.perf.step_sizes,
andante.exec.torch_warmup), so no served step pays oneDNN's setup of a new size;
`ANDANTE_NO_STEP_BUCKETS=1` turns both off.

Sleep mode (vLLM's dev-mode sleep, andante.exec.base.Sleepable; called on the engine's
stepping thread between steps, with the server drained): `sleep(1)` drops both KV tiers'
tensors and every layer's view of them (KVPools.release, TransformerRunner.bind_kv) and
trims the heap so the pages go back to the kernel (andante.exec.malloc_tuning);
`sleep(2)` also drops the weights, the loaded ones and the packed ones (the whole
runner). `wake_up()` allocates the KV tiers again with the same shapes (zeroed; the
block manager's prefix cache is reset by the caller, see andante.server.sleep) and, after
level 2, reloads the weights from the checkpoint the model was loaded from
(`LoadedModel.path`, in its load dtype; one copy for the executors that wake together,
andante.exec.torch_reload) and packs them in the layer form chosen at
start-up (not timed again). The primitive warm-up is not run again: oneDNN's primitive
cache is keyed by shapes, which did not change.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from andante.exec.batch import StepBatch, StepResult
from andante.exec.malloc_tuning import keep_freed_memory, release_freed_memory
from andante.exec.thread_adapter import ThreadAdapter, adaptive_class, class_range
from andante.exec.torch_attention import (
    DECODE_PATHS,
    PREFILL_CHOICE_SHAPES,
    decode_path_choice,
    decode_threads_choice,
    prefill_matmul_choice,
)
from andante.exec.torch_cost import CPU_PROFILE, engine_cost_model
from andante.exec.torch_inputs import InputBuilder
from andante.exec.torch_kv import KVPools
from andante.exec.torch_layer_form import CHOICE_ROWS, LAYER_FORMS, choose_layer_form
from andante.exec.torch_layers import packed_gemm_supported
from andante.exec.torch_model import TransformerRunner
from andante.exec.torch_reload import ReloadedWeights, reload_weights
from andante.exec.torch_sampler import Sampler
from andante.exec.torch_threads import (
    ThreadChoice,
    cached_thread_choice,
    measure_thread_choice,
    probe_context,
    probe_key,
)
from andante.exec.torch_warmup import (
    WarmUp,
    WarmUpPlan,
    lm_head_thread_counts,
    primitive_cache_for,
    warm_buckets,
)
from andante.models.loader import LoadedModel, parse_dtype
from andante.models.weights import ModelWeights
from andante.perf.cost_model import CostModel
from andante.perf.paths import env_switch
from andante.perf.specs import ModelSpec
from andante.perf.step_sizes import NO_BUCKETS_ENV, StepBuckets

GIB = 1 << 30
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TorchExecutorOptions:
    """dtype: "bfloat16" / "float32" (weights are cast if loaded otherwise);
    num_threads: torch intra-op threads (None leaves torch's setting alone);
    kv_cache_gib / swap_space_gib: device / host KV pool sizes; block_size must equal
    the scheduler's; max_model_len caps positions (None: the model's context);
    parallel_min_tokens: steps with fewer tokens (small decode batches) run on one
    thread; "auto" measures it at start-up (decode steps of 1-16 requests timed on one
    and on all threads, see andante.exec.torch_threads) or reuses the choice cached for
    this machine and model; None: always all threads; reprobe_threads: measure "auto"
    again even when a choice is cached (as does $ANDANTE_REPROBE_THREADS=1);
    adapt_threads: with "auto", keep adapting each step size's thread count to the CPU
    the engine gets while it runs (andante.exec.thread_adapter);
    decode_attention: decode rows' attention by PyTorch's fused kernel ("sdpa"), by
    float32 matmuls ("matmul"), by matmuls in the model dtype ("matmul_native"), or
    ("auto") whichever is fastest here, timed at start-up;
    decode_attention_threads: with more than one thread, decode attention of small
    batches on one thread while the step's GEMMs use all ("auto": below the batch size
    timed at start-up, andante.exec.thread_scope), of every batch ("one"), or never
    ("all");
    prefill_attention: prefill chunks' attention by the fused kernel ("sdpa"), by
    matmuls in the model dtype ("matmul"), or ("auto") whichever is faster here, timed
    at start-up in bfloat16 (float32 keeps the fused kernel);
    layer_form: the bf16 fused layers with oneDNN epilogues ("epilogue"), plain
    ("plain"), or ("auto") whichever is faster here, timed at start-up
    (andante.exec.torch_layer_form);
    seed: the generator of unseeded sampling; hardware: cost-model profile name;
    step_buckets: pad each step's GEMM rows to a step-size bucket (bf16 fused path; off
    with $ANDANTE_NO_STEP_BUCKETS=1); warmup_tokens: run every bucket up to this many
    rows at start-up ("auto": the executor's max_model_len, the step budget of a server
    with the default options; None: no warm-up, e.g. tests and tiny models);
    warmup_seqs: the most sampled rows a step has (the scheduler's max_num_seqs), so
    the LM head's buckets are warmed up to it."""

    dtype: str = "bfloat16"
    num_threads: int | None = None
    kv_cache_gib: float = 1.0
    swap_space_gib: float = 1.0
    block_size: int = 16
    max_model_len: int | None = None
    parallel_min_tokens: int | Literal["auto"] | None = "auto"
    reprobe_threads: bool = False
    adapt_threads: bool = True
    decode_attention: Literal["auto", "sdpa", "matmul", "matmul_native"] = "auto"
    decode_attention_threads: Literal["auto", "one", "all"] = "auto"
    prefill_attention: Literal["auto", "sdpa", "matmul"] = "auto"
    layer_form: Literal["auto", "epilogue", "plain"] = "auto"
    seed: int = 0
    hardware: str = CPU_PROFILE
    step_buckets: bool = True
    warmup_tokens: int | Literal["auto"] | None = "auto"
    warmup_seqs: int = 256

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        if isinstance(self.warmup_tokens, str):
            if self.warmup_tokens != "auto":
                raise ValueError("warmup_tokens must be an int, 'auto' or None, got "
                                 f"{self.warmup_tokens!r}")
        elif self.warmup_tokens is not None and self.warmup_tokens < 1:
            raise ValueError(f"warmup_tokens must be >= 1, got {self.warmup_tokens}")
        if self.warmup_seqs < 1:
            raise ValueError(f"warmup_seqs must be >= 1, got {self.warmup_seqs}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if not self.swap_space_gib >= 0:
            raise ValueError(f"swap_space_gib must be >= 0, got {self.swap_space_gib}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if isinstance(self.parallel_min_tokens, str):
            if self.parallel_min_tokens != "auto":
                raise ValueError("parallel_min_tokens must be an int, 'auto' or None, got "
                                 f"{self.parallel_min_tokens!r}")
        elif self.parallel_min_tokens is not None and self.parallel_min_tokens < 1:
            raise ValueError(f"parallel_min_tokens must be >= 1, got {self.parallel_min_tokens}")
        if self.layer_form not in LAYER_FORMS:
            raise ValueError(f"layer_form must be one of {LAYER_FORMS}, got "
                             f"{self.layer_form!r}")
        if self.decode_attention_threads not in ("auto", "one", "all"):
            raise ValueError("decode_attention_threads must be 'auto', 'one' or 'all', got "
                             f"{self.decode_attention_threads!r}")
        if self.decode_attention not in ("auto", *DECODE_PATHS):
            raise ValueError(f"decode_attention must be 'auto' or one of {DECODE_PATHS}, "
                             f"got {self.decode_attention!r}")
        if self.prefill_attention not in ("auto", "sdpa", "matmul"):
            raise ValueError("prefill_attention must be 'auto', 'sdpa' or 'matmul', got "
                             f"{self.prefill_attention!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


class TorchExecutor:
    """Runs a `LoadedModel` on the CPU with torch; see the Executor protocol."""

    def __init__(self, model: LoadedModel, options: TorchExecutorOptions | None = None,
                 cost_model: CostModel | None = None) -> None:
        self.options = options or TorchExecutorOptions()
        self.model = model
        self.sleeping: int | None = None  # sleep mode's level; None when awake
        self._runner: TransformerRunner | None = None
        self._load_dtype = model.dtype  # what a level-2 wake-up reloads the weights in
        self._reloaded: ReloadedWeights | None = None  # after a level-2 wake-up
        keep_freed_memory()
        self._init_threads()
        self._init_buckets()
        with primitive_cache_for(self._num_buckets()):
            self._init_runner()
        self._init_decode_path()
        self._init_thread_choice()
        self._init_warmup()
        self.cost_model = cost_model or engine_cost_model(self.spec, self.options.hardware)

    def _init_threads(self) -> None:
        if self.options.num_threads is not None:
            torch.set_num_threads(self.options.num_threads)
        self.num_threads = torch.get_num_threads()

    def _init_decode_path(self) -> None:
        """Decode attention by the fused kernel or by float32 matmuls: the option, or
        ("auto") whichever is faster on this CPU at the model's shapes
        (andante.exec.torch_attention.choose_decode_path)."""
        c = self.model.config
        path, self.decode_path_us = decode_path_choice(
            self.options.decode_attention, c.num_heads, c.num_kv_heads, c.head_dim,
            self.dtype, self.options.block_size)
        self.inputs.decode_matmul = path != "sdpa"
        self.inputs.decode_native = path == "matmul_native"
        if self.decode_path_us:
            log.info("decode attention: %s (us per layer call summed over batches 1, 8, "
                     "16: %s)", path, self.decode_path_us)
        below, self.decode_threads_us = decode_threads_choice(
            self.options.decode_attention_threads, c.num_heads, c.num_kv_heads, c.head_dim,
            self.dtype, self.options.block_size, path, self.num_threads)
        self.inputs.decode_one_thread_below = below
        if self.decode_threads_us:
            log.info("decode attention on one thread below batch %d (us per layer call, "
                     "one thread vs %d: %s)", below, self.num_threads, self.decode_threads_us)
        prefill, self.prefill_path_us = prefill_matmul_choice(
            self.options.prefill_attention, c.num_heads, c.num_kv_heads, c.head_dim,
            self.dtype)
        self.inputs.prefill_matmul = prefill
        if self.prefill_path_us:
            log.info("prefill attention: %s (us per layer call summed over %s: %s)",
                     "matmul" if prefill else "sdpa", PREFILL_CHOICE_SHAPES,
                     self.prefill_path_us)

    def _init_thread_choice(self) -> None:
        self.thread_adapter: ThreadAdapter | None = None
        wanted = self.options.parallel_min_tokens
        if wanted != "auto":
            self.thread_choice = ThreadChoice(wanted)
            return
        if self.num_threads <= 1:
            self.thread_choice = ThreadChoice(None, source="one thread")
            return
        pool_tokens = self.kv.num_device_blocks * self.options.block_size
        max_context = min(self.max_model_len, pool_tokens) - 1
        measure = partial(measure_thread_choice, self._forward, self.options.block_size,
                          self.num_threads, max_context)
        key = probe_key(self._model_shape(max_context), self.num_threads)
        self.thread_choice = cached_thread_choice(measure, key, self.options.reprobe_threads)
        log.info("threads: %s", self.thread_choice.describe())
        if self.options.adapt_threads:
            self.thread_adapter = ThreadAdapter(self.num_threads, self._rule_threads)

    def _model_shape(self, max_context: int) -> dict[str, object]:
        """What of the model and the pool the thread probe's timings depend on."""
        c = self.model.config
        return {"layers": c.num_layers, "hidden": c.hidden_size, "heads": c.num_heads,
                "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
                "intermediate": c.intermediate_size, "vocab": c.vocab_size,
                "dtype": str(self.dtype), "fused": self.runner.fused,
                "block_size": self.options.block_size,
                "probe_context": probe_context(max_context)}

    def _init_buckets(self) -> None:
        """The step buckets: on unless switched off, on the fused path only."""
        on = (self.options.step_buckets and not env_switch(NO_BUCKETS_ENV)
              and packed_gemm_supported(parse_dtype(self.options.dtype)))
        self.step_buckets: StepBuckets | None = StepBuckets() if on else None

    def _num_buckets(self) -> int:
        """How many buckets the warm-up may run (0 without buckets), at most."""
        if self.step_buckets is None:
            return 0
        limit = self.model.config.max_model_len
        if isinstance(self.options.warmup_tokens, int):
            limit = max(limit, self.options.warmup_tokens)
        return len(self.step_buckets.sizes(limit))

    def _init_warmup(self) -> None:
        """Run every bucket up to the warm-up limit once (fused path, buckets on)."""
        self.warmup = WarmUp((), 0.0)
        wanted = self.options.warmup_tokens
        if self.runner.buckets is None or wanted is None:
            return
        self.warmup = self.warm_up(None if wanted == "auto" else wanted)
        log.info("%s", self.warmup.describe())

    def warm_up(self, max_tokens: int | None = None, max_seqs: int | None = None) -> WarmUp:
        """Build the primitives of every bucket up to `max_tokens` rows (default: the
        model's length; LM head: up to `max_seqs` rows, default the option's); call
        before serving (it writes K/V to unowned blocks)."""
        max_tokens = self.max_model_len if max_tokens is None else max_tokens
        max_seqs = self.options.warmup_seqs if max_seqs is None else max_seqs
        buckets = self.runner.buckets
        if buckets is None:
            return WarmUp((), 0.0)
        plan = WarmUpPlan(buckets, max_tokens, max_seqs, self.max_model_len,
                          self.options.block_size, self.kv.num_device_blocks)
        threads_of = partial(lm_head_thread_counts,
                             parallel_min_tokens=self.thread_choice.parallel_min_tokens,
                             num_threads=self.num_threads)
        warmup = warm_buckets(self._warmup_step, self._warmup_lm_head, threads_of, plan)
        torch.set_num_threads(self.num_threads)
        return warmup

    @contextmanager
    def unbucketed(self) -> Iterator[None]:
        """Steps run at their own row counts inside the block (a calibration timing
        exact sizes on an executor that has buckets); the buckets come back after."""
        buckets, self.runner.buckets = self.runner.buckets, None
        try:
            yield
        finally:
            self.runner.buckets = buckets

    def _warmup_step(self, batch: StepBatch) -> None:
        """A warm-up step: the first layer and the LM head, at the step's thread count."""
        self._set_threads(batch.num_tokens)
        self._forward(batch, num_layers=1)

    def _warmup_lm_head(self, num_rows: int, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        with torch.inference_mode():
            self.runner.lm_head(torch.zeros(num_rows, self.model.config.hidden_size,
                                            dtype=self.dtype))

    def _set_threads(self, num_tokens: int) -> tuple[int, int]:
        """One thread or all for a step of `num_tokens` rows, decided on its size class
        (its bucket, so that a step runs at the thread count its bucket was warmed at;
        without buckets, the next power of two): the start-up rule, or the adapter's
        current choice. Returns (size class, thread count)."""
        if self.runner.buckets is not None:
            size = self.runner.buckets.pad(num_tokens)
        else:
            size = 1 << max(0, num_tokens - 1).bit_length()
        adapter = self.thread_adapter
        if adapter is None:
            wanted = self._rule_threads(size)
        else:
            wanted = adapter.threads_for(adaptive_class(size))
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
        return size, wanted

    def _rule_threads(self, size: int) -> int:
        """The start-up choice: one thread below the measured threshold, else all."""
        threshold = self.thread_choice.parallel_min_tokens
        return 1 if threshold is not None and size < threshold else self.num_threads

    def _init_runner(self) -> None:
        opts, config = self.options, self.model.config
        self.dtype = parse_dtype(opts.dtype)
        self.max_model_len = min(opts.max_model_len or config.max_model_len,
                                 config.max_model_len)
        token_bytes = config.with_dtype(self.dtype.itemsize).kv_bytes_per_token
        block_bytes = token_bytes * opts.block_size
        self.kv = KVPools(config.num_layers, config.num_kv_heads, config.head_dim,
                          opts.block_size, int(opts.kv_cache_gib * GIB // block_bytes),
                          int(opts.swap_space_gib * GIB // block_bytes), self.dtype)
        self.epilogues = True
        self.layer_form_us: dict[str, float] = {}
        if packed_gemm_supported(self.dtype):
            self.epilogues, self.layer_form_us = choose_layer_form(opts.layer_form, config,
                                                                   self.dtype)
            log.info("fused layers: %s (us per layer summed over %s rows: %s)",
                     "epilogues" if self.epilogues else "plain", CHOICE_ROWS,
                     self.layer_form_us or "set")
        self._runner = self._build_runner(self.model.weights)
        self.inputs = InputBuilder(opts.block_size, self.max_model_len, config.num_kv_heads,
                                   config.num_heads // config.num_kv_heads, self.dtype)
        self.sampler = Sampler(opts.seed)

    def _build_runner(self, weights: ModelWeights) -> TransformerRunner:
        """The layers over `weights` (cast to the executor's dtype), packed in the form
        chosen at start-up, bound to the KV pools."""
        return TransformerRunner(self.model.config, weights.to(self.dtype), self.kv,
                                 self.max_model_len, buckets=self.step_buckets,
                                 epilogues=self.epilogues)

    @property
    def runner(self) -> TransformerRunner:
        if self._runner is None:
            raise RuntimeError(self._asleep_message())
        return self._runner

    def _asleep_message(self) -> str:
        return (f"the torch executor is asleep (level {self.sleeping}): its "
                f"{'KV cache and weights are' if self.sleeping == 2 else 'KV cache is'} "
                "released; wake it up first (POST /wake_up)")

    # ---- sleep mode (andante.exec.base.Sleepable; see the module note) --------------
    def sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        if self.sleeping is None:
            self.kv.release()
            self.runner.bind_kv(self.kv)
        if level == 2 and self._runner is not None:
            self._runner = None
            self._reloaded = None
            self.model = dataclasses.replace(self.model, weights=_no_weights(self.model.dtype))
        self.sleeping = max(level, self.sleeping or 0)
        release_freed_memory()

    def wake_up(self) -> None:
        if self.sleeping is None:
            return
        self.kv.restore()
        if self._runner is None:
            self._reloaded = reload_weights(self.model.path, self._load_dtype)
            weights = self._reloaded.weights
            self.model = dataclasses.replace(self.model, weights=weights)
            with primitive_cache_for(self._num_buckets()):
                self._runner = self._build_runner(weights)
            release_freed_memory()  # the loader's temporary buffers
        else:
            self._runner.bind_kv(self.kv)
        self.sleeping = None

    @property
    def spec(self) -> ModelSpec:
        """The cost model's ModelSpec of the served model in the executor's dtype."""
        return self.model.config.with_dtype(self.dtype.itemsize, self.model.name)

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        if block_size != self.options.block_size:
            raise ValueError(f"executor block size {self.options.block_size} != "
                             f"scheduler block size {block_size}")
        return self.kv.num_device_blocks, self.kv.num_host_blocks

    def _forward(self, batch: StepBatch, num_layers: int | None = None) -> dict[int, int]:
        """One forward pass and sampling; the sampled token of each sampling request.
        `num_layers`: the first layers only (the warm-up)."""
        with torch.inference_mode():
            inputs = self.inputs.build(batch)
            logits = self.runner.forward(inputs, num_layers)
            if not inputs.sample_index:
                return {}
            owners = [batch.requests[i] for i in inputs.sample_index]
            tokens = self.sampler.sample(logits, owners)
        return dict(zip(inputs.sample_index, tokens, strict=True))

    def execute(self, batch: StepBatch) -> StepResult:
        if self.sleeping is not None:
            raise RuntimeError(self._asleep_message())
        started = time.perf_counter()
        swap_time = self.kv.swap(batch.swap_out, batch.swap_in)
        sampled: list[int | None] = [None] * len(batch.requests)
        if batch.requests:
            size, threads = self._set_threads(batch.num_tokens)
            forward_started = time.perf_counter()
            for i, token in self._forward(batch).items():
                sampled[i] = token
            self._observe(size, threads, time.perf_counter() - forward_started)
        return StepResult(sampled, time.perf_counter() - started, swap_time)

    def _observe(self, size: int, threads: int, seconds: float) -> None:
        if self.thread_adapter is None:
            return
        size_class = adaptive_class(size)  # per-row time scaled to the class's size
        decision = self.thread_adapter.observe(size_class, threads, seconds * size_class / size)
        if decision is not None:
            medians = ", ".join(f"{c} thread(s) {m * 1e3:.1f} ms"
                                for c, m in decision.medians.items())
            log.info("threads: steps of %s rows now run on %d thread(s) (%s re-probe: %s)",
                     class_range(size_class), decision.threads, decision.reason, medians)


def _no_weights(dtype: torch.dtype) -> ModelWeights:
    """What an executor asleep at level 2 keeps of its model's weights: nothing."""
    empty = torch.empty(0, dtype=dtype)
    return ModelWeights(empty, [], empty, empty)
