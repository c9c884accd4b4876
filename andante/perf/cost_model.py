"""Step-time cost model: roofline terms combined by Ascendra's fitted regression.

Design note. Ascendra §5.1 models a batch's latency from its memory traffic M and its
FLOPs F: with tM = M / bandwidth and tF = F / peak FLOP/s,
    t = C1·(tM + tF) + C2·max(tM, tF) + C3·tM + C4·tF + C5,
the sum standing for no overlap of transfer and compute, the max for full overlap.
M and F come from the model's shape: the weights are streamed once per step, attention
reads each sequence's KV cache, and the attention FLOPs follow KunServe eq. (1) (a chunk
of c new tokens after p cached ones has p·c + (c² + c)/2 query-key pairs; see
`BatchShape`). Tensor parallelism divides M and F by tp and adds two ring all-reduces
of the hidden states per layer (Megatron-LM), which are not part of the regression.

On a CPU a calibrated profile adds three terms (andante.perf.fit): c6·tKV, the KV cache
that attention reads over the memory bandwidth (a paged gather reads it far slower per
byte than a GEMV streams weights); a second coefficient set for the steps the engine
runs on one thread (fewer than `serial_below_tokens` tokens: small decode batches), as
the executor itself decides (andante.exec.torch_threads); and the extra cost of a step
whose token count the engine has not run recently (`new_size_time`, added by the
executor that tracks its sizes: andante.perf.step_sizes). One set over both thread
regimes had to compromise: measured on this engine (2 threads, single-threaded decodes),
it over-predicted small decode steps by 10-25% (the TPOT of light serving) while
under-predicting long-context decodes by 50-70% and prefills by ~15%.

A profile of an engine that captures only its decode steps as CUDA graphs (vLLM V0,
plain PyTorch: the shared H200 measurement, andante.perf.hardware) sets
`eager_launch_per_layer`: its other steps are launched op by op, and while the GPU
work is short the host's launching is the step's time, so a step with prefill tokens
takes max(the regression's time, num_layers x that). (Launches overlap the GPU work,
hence a max and not a sum.)

A profile fitted to a served engine whose step time bends with the prefill size sets
`prefill_factors` (andante.perf.prefill_factors): a step with p > 0 prefill tokens costs
the regression's time times the factor of floor(log2 p), before the launch floor. One
whose decode steps bend with their batch sets `decode_factors` likewise, by floor(log2 d)
of a step of d decodes alone (andante.perf.decode_factors). A step of d decodes and one
prefill token pays prefill_factor(1), not decode_factor(d), so with either table set the
step time need not grow from d decodes to d decodes and a token.

Everything per step is plain float arithmetic on constants precomputed in __init__:
the simulator calls `step_time` once per simulated step.
"""

from __future__ import annotations

from andante.perf.prefill_factors import size_class
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec, ModelSpec

GiB = 1 << 30
# Per-GPU memory kept out of the KV cache for activations, CUDA graphs and the
# allocator's slack (vLLM profiles this at start-up; ~1-3 GiB for 7-70B models).
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GiB
LOGIT_BYTES = 4  # logits are produced in FP32


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


class CostModel:
    """Predicts the duration of engine steps and KV operations for one instance."""

    __slots__ = (
        "model", "hardware", "tp", "coefficients", "kv_bytes_per_token_per_gpu",
        "_body_bytes", "_lm_head_bytes", "_bytes_per_token", "_bytes_per_kv_read",
        "_bytes_per_sample", "_flops_per_token", "_flops_per_pair", "_flops_per_sample",
        "_inv_bandwidth", "_inv_peak", "_c_sum", "_c_max", "_c_mem", "_c_flop", "_c_fixed",
        "_c_kv_token", "_serial_coeffs", "_serial_below", "_eager_floor",
        "_comm_fixed", "_comm_per_token", "_prefill_factors", "_decode_factors",
    )

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp: int = 1,
                 coefficients: CostCoefficients | None = None) -> None:
        self._init_config(model, hardware, tp, coefficients)
        self._init_memory_terms()
        self._init_flop_terms()
        self._init_comm_terms()

    def _init_config(self, model: ModelSpec, hardware: HardwareSpec, tp: int,
                     coefficients: CostCoefficients | None) -> None:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        if model.num_heads % tp:
            raise ValueError(f"tp={tp} must divide num_heads={model.num_heads} of {model.name}")
        if model.num_kv_heads % tp and tp % model.num_kv_heads:
            raise ValueError(f"tp={tp} and num_kv_heads={model.num_kv_heads} of {model.name} "
                             "must divide one another")
        self.model = model
        self.hardware = hardware
        self.tp = tp
        # Explicit coefficients (an online refit) stand for every step kind.
        self.coefficients = coefficients if coefficients is not None else hardware.coefficients
        serial = hardware.serial_coefficients if coefficients is None else None
        self._c_sum, self._c_max, self._c_mem, self._c_flop, self._c_fixed = (
            self.coefficients.as_tuple())
        # steps of fewer than `_serial_below` tokens use `_serial_coeffs` (0: none do)
        self._serial_coeffs = (*self.coefficients.as_tuple(), self.coefficients.c6)
        self._serial_below = 0
        if serial is not None and hardware.serial_below_tokens is not None:
            self._serial_coeffs = (*serial.as_tuple(), serial.c6)
            self._serial_below = hardware.serial_below_tokens
        # the least time of a step with prefill tokens (launched op by op); 0: none
        self._eager_floor = hardware.eager_launch_per_layer * model.num_layers
        # per floor(log2 prefill tokens): a fitted engine's non-linear prefill cost
        self._prefill_factors = hardware.prefill_factors
        # per floor(log2 decodes) of a step of decodes alone: its non-linear decode cost
        self._decode_factors = hardware.decode_factors

    def _init_memory_terms(self) -> None:
        m, tp = self.model, self.tp
        dtype = m.dtype_bytes
        # With tp > num_kv_heads each GPU keeps one KV head (replicated), as in vLLM.
        kv_heads_per_gpu = max(1, m.num_kv_heads // tp)
        self.kv_bytes_per_token_per_gpu = 2 * m.num_layers * kv_heads_per_gpu * m.head_dim * dtype
        lm_head = m.embedding_params * dtype
        self._lm_head_bytes = lm_head / tp
        self._body_bytes = (m.streamed_weight_bytes - lm_head) / tp
        # Each GEMM reads its input and writes its output once; norms, residuals fused.
        gemm_io = (6 * m.hidden_size
                   + (2 * m.q_size + 2 * m.kv_size) / tp
                   + (3 if m.mlp_kind == "gated" else 2) * m.intermediate_size / tp)
        activations = m.num_layers * gemm_io * dtype
        self._bytes_per_token = activations + self.kv_bytes_per_token_per_gpu  # + KV write
        self._bytes_per_kv_read = float(self.kv_bytes_per_token_per_gpu)
        self._bytes_per_sample = m.hidden_size * dtype + m.vocab_size * LOGIT_BYTES / tp
        self._inv_bandwidth = 1.0 / self.hardware.mem_bandwidth
        # c6·tKV as seconds per KV token read (0 unless a calibration fitted c6)
        self._c_kv_token = self.coefficients.c6 * self._bytes_per_kv_read * self._inv_bandwidth

    def _init_flop_terms(self) -> None:
        m, tp = self.model, self.tp
        self._flops_per_token = m.dense_flops_per_token / tp
        self._flops_per_pair = m.attn_flops_per_pair / tp
        self._flops_per_sample = m.lm_head_flops_per_token / tp
        self._inv_peak = 1.0 / self.hardware.peak_flops

    def _init_comm_terms(self) -> None:
        tp, hw, m = self.tp, self.hardware, self.model
        if tp == 1:
            self._comm_fixed = 0.0
            self._comm_per_token = 0.0
            return
        num_allreduces = 2 * m.num_layers  # after attention and after the MLP
        ring_factor = 2.0 * (tp - 1) / tp
        self._comm_fixed = num_allreduces * hw.collective_latency
        self._comm_per_token = (num_allreduces * ring_factor * m.hidden_size * m.dtype_bytes
                                / hw.interconnect_bandwidth)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token across the instance (all tp GPUs)."""
        return self.kv_bytes_per_token_per_gpu * self.tp

    def with_coefficients(self, coefficients: CostCoefficients) -> CostModel:
        return CostModel(self.model, self.hardware, self.tp, coefficients)

    def terms(self, shape: BatchShape) -> tuple[float, float]:
        """(tM, tF) of one step in seconds, per GPU; (0, 0) for an empty step."""
        n = shape.num_tokens
        if n <= 0:
            return (0.0, 0.0)
        mem = (self._body_bytes + self._bytes_per_token * n
               + self._bytes_per_kv_read * shape.kv_tokens_read)
        flops = self._flops_per_token * n + self._flops_per_pair * shape.attn_pairs
        s = shape.num_sampled
        if s:
            mem += self._lm_head_bytes + self._bytes_per_sample * s
            flops += self._flops_per_sample * s
        return (mem * self._inv_bandwidth, flops * self._inv_peak)

    def kv_read_time(self, shape: BatchShape) -> float:
        """tKV: the KV cache the step's attention reads, over the memory bandwidth."""
        return shape.kv_tokens_read * self._bytes_per_kv_read * self._inv_bandwidth

    def comm_time(self, num_tokens: int) -> float:
        """Tensor-parallel all-reduce time of a step that advances `num_tokens` tokens."""
        if num_tokens <= 0:
            return 0.0
        return self._comm_fixed + self._comm_per_token * num_tokens

    def step_time(self, shape: BatchShape) -> float:
        """Predicted duration in seconds of one engine step; 0.0 for an empty step."""
        n = shape.num_tokens
        if n <= 0:
            return 0.0
        t_m, t_f = self.terms(shape)
        t_max = t_m if t_m > t_f else t_f
        if n < self._serial_below:
            c_sum, c_max, c_mem, c_flop, c_fixed, c_kv = self._serial_coeffs
            t = (c_sum * (t_m + t_f) + c_max * t_max + c_mem * t_m + c_flop * t_f
                 + c_fixed + c_kv * self.kv_read_time(shape)
                 + self._comm_fixed + self._comm_per_token * n)
        else:
            t = (self._c_sum * (t_m + t_f) + self._c_max * t_max + self._c_mem * t_m
                 + self._c_flop * t_f + self._c_fixed
                 + self._c_kv_token * shape.kv_tokens_read
                 + self._comm_fixed + self._comm_per_token * n)
        # size_factor's branching, repeated here for speed (pinned equal by the
        # hypothesis test in tests/perf/test_decode_factors.py)
        if self._decode_factors and shape.num_decode_seqs == shape.num_seqs:
            t *= self.decode_factor(shape.num_decode_seqs)
        elif self._prefill_factors and n > shape.num_decode_seqs:
            t *= self.prefill_factor(n - shape.num_decode_seqs)
        if t < self._eager_floor and shape.num_decode_seqs < shape.num_seqs:
            return self._eager_floor  # launched op by op: the host's launching takes longer
        return t

    def prefill_factor(self, num_prefill_tokens: int) -> float:
        """The profile's factor on the regression for a step with `num_prefill_tokens`
        (> 0) tokens that are not decodes (HardwareSpec.prefill_factors; 1 without)."""
        index = size_class(num_prefill_tokens)
        factors = self._prefill_factors
        return factors[index] if 0 <= index < len(factors) else 1.0

    def decode_factor(self, num_decodes: int) -> float:
        """The profile's factor on the regression for a step of `num_decodes` (> 0)
        decodes alone (HardwareSpec.decode_factors; 1 without)."""
        index = size_class(num_decodes)
        factors = self._decode_factors
        return factors[index] if 0 <= index < len(factors) else 1.0

    def size_factor(self, shape: BatchShape) -> float:
        """The factor `step_time` applies to the regression's time of `shape`: its
        decode factor, its prefill factor, or 1."""
        if self._decode_factors and shape.num_decode_seqs == shape.num_seqs:
            return self.decode_factor(shape.num_decode_seqs)
        if self._prefill_factors and shape.num_tokens > shape.num_decode_seqs:
            return self.prefill_factor(shape.num_tokens - shape.num_decode_seqs)
        return 1.0

    def decode_step_times(self, shape: BatchShape, max_steps: int,
                          time_budget: float = float("inf")) -> list[float]:
        """`step_time` of `shape` and of the all-decode steps after it (each sequence one
        token longer per step, `BatchShape.advance_decodes`), up to `max_steps` and
        stopping once their sum reaches `time_budget`. The same float operations as
        `step_time` step after step, with the terms that stay fixed computed once (the
        simulator's decode runs, andante.sim.decode_run)."""
        n, s, seqs = shape.num_tokens, shape.num_sampled, shape.num_seqs
        if n <= 0:
            return [0.0] * max(0, max_steps) if time_budget > 0 else []
        mem_fixed = self._body_bytes + self._bytes_per_token * n
        flops_fixed = self._flops_per_token * n
        mem_sampled = self._lm_head_bytes + self._bytes_per_sample * s
        flops_sampled = self._flops_per_sample * s
        per_kv, per_pair = self._bytes_per_kv_read, self._flops_per_pair
        inv_bw, inv_peak = self._inv_bandwidth, self._inv_peak
        # a decode run keeps its token count, so one regime (and coefficient set) holds
        serial = n < self._serial_below
        if serial:
            c_sum, c_max, c_mem, c_flop, c_fixed, c_kv = self._serial_coeffs
        else:
            c_sum, c_max, c_mem, c_flop = self._c_sum, self._c_max, self._c_mem, self._c_flop
            c_fixed, c_kv = self._c_fixed, self._c_kv_token
        comm_fixed, comm = self._comm_fixed, self._comm_per_token * n
        kv, pairs = shape.kv_tokens_read, shape.attn_pairs
        # `step_time`'s floor: only where a sequence of the shape is no decode
        floor = self._eager_floor if shape.num_decode_seqs < seqs else 0.0
        # and its decode or prefill factor, likewise (the run's shape keeps its counts)
        factor = self.size_factor(shape)
        durations: list[float] = []
        total = 0.0
        while len(durations) < max_steps and total < time_budget:
            mem = mem_fixed + per_kv * kv
            flops = flops_fixed + per_pair * pairs
            if s:
                mem += mem_sampled
                flops += flops_sampled
            t_m, t_f = mem * inv_bw, flops * inv_peak
            t_max = t_m if t_m > t_f else t_f
            # the c6·tKV term exactly as `step_time` computes it in each regime
            kv_term = c_kv * (kv * per_kv * inv_bw) if serial else c_kv * kv
            duration = (c_sum * (t_m + t_f) + c_max * t_max + c_mem * t_m + c_flop * t_f
                        + c_fixed + kv_term + comm_fixed + comm)
            if factor != 1.0:
                duration *= factor
            if duration < floor:
                duration = floor
            durations.append(duration)
            total += duration
            kv += seqs
            pairs += seqs
        return durations

    def new_size_time(self, num_tokens: int) -> float:
        """What the first step of `num_tokens` tokens costs on top of `step_time` where the
        engine has not run that size recently (andante.perf.step_sizes); 0 by default."""
        hw = self.hardware
        if num_tokens <= 0 or not hw.new_size_cache:
            return 0.0
        return hw.new_size_fixed + hw.new_size_per_token * num_tokens

    def wake_time(self, idle_for: float) -> float:
        """What a step that starts after `idle_for` seconds without a step costs on top
        of `step_time` (HardwareSpec.idle_wake from idle_wake_after on,
        andante.perf.idle_wake); 0 by default and for a step that follows another."""
        hw = self.hardware
        if hw.idle_wake <= 0 or idle_for <= 0 or idle_for < hw.idle_wake_after:
            return 0.0
        return hw.idle_wake

    def prefill_time(self, num_tokens: int, num_cached: int = 0) -> float:
        """One step prefilling `num_tokens` new tokens after `num_cached` cached ones."""
        _check_count("num_tokens", num_tokens)
        _check_count("num_cached", num_cached)
        if num_tokens == 0:
            return 0.0
        shape = BatchShape(
            num_seqs=1, num_tokens=num_tokens, num_sampled=1,
            num_decode_seqs=1 if num_tokens == 1 and num_cached > 0 else 0,
            attn_pairs=num_cached * num_tokens + (num_tokens * num_tokens + num_tokens) * 0.5,
            kv_tokens_read=num_cached + num_tokens,
        )
        return self.step_time(shape)

    def decode_time(self, batch_size: int, context_len: int) -> float:
        """One step decoding one token for each of `batch_size` sequences of `context_len`."""
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len)
        if batch_size == 0:
            return 0.0
        shape = BatchShape(
            num_seqs=batch_size, num_tokens=batch_size, num_sampled=batch_size,
            num_decode_seqs=batch_size if context_len > 0 else 0,
            attn_pairs=float(batch_size * (context_len + 1)),
            kv_tokens_read=batch_size * (context_len + 1),
        )
        return self.step_time(shape)

    def swap_time(self, num_tokens: int) -> float:
        """Copying `num_tokens` tokens of KV cache one way between device and host.

        Every GPU of the instance moves its own shard over its own host link, in parallel.
        """
        _check_count("num_tokens", num_tokens)
        return num_tokens * self.kv_bytes_per_token_per_gpu / self.hardware.host_link_bandwidth

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9,
                           activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES
                           ) -> int:
        """Tokens of KV cache that fit in the instance (tp GPUs, weights sharded)."""
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], "
                             f"got {gpu_memory_utilization!r}")
        if activation_reserve_bytes < 0:
            raise ValueError(f"activation_reserve_bytes must be >= 0, "
                             f"got {activation_reserve_bytes!r}")
        usable = self.hardware.mem_capacity * gpu_memory_utilization - activation_reserve_bytes
        free = usable - self.model.weight_bytes / self.tp
        if free <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / GiB:.1f} GiB of weights) does "
                f"not fit on {self.tp} x {self.hardware.name} at gpu_memory_utilization="
                f"{gpu_memory_utilization} with {activation_reserve_bytes / GiB:.1f} GiB "
                "reserved per GPU")
        return int(free // self.kv_bytes_per_token_per_gpu)
