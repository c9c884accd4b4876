"""Model and hardware specifications: the static inputs of the cost model.

A `ModelSpec` is a dense decoder-only transformer described by the fields of its public
`config.json` (or GGUF metadata): the one description of a model's architecture, read
by the cost model (its derived properties count parameters, bytes and FLOPs) and by the
torch model that runs it (andante.models: RMSNorm, RoPE optionally scaled, grouped-query
attention, SwiGLU MLP, optional q/k/v biases). A `HardwareSpec` is one accelerator (one
GPU of a tensor-parallel instance) with the regression coefficients of Ascendra §5.1
that turn roofline terms into a step time.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

MlpKind = Literal["gated", "plain"]
MLP_KINDS: tuple[str, ...] = ("gated", "plain")
ROPE_TYPES = ("default", "linear", "llama3")

HARDWARE_JSON_VERSION = 1


def _require_positive_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def _require_rate(owner: str, name: str, value: object, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    else:
        ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{owner}.{name} must be a finite {bound} number, got {value!r}")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE scaling as Hugging Face describes it (`rope_scaling` / `rope_parameters`)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope scaling type {self.rope_type!r}; "
                             f"supported: {', '.join(ROPE_TYPES)}")
        if not self.factor > 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor!r}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A dense decoder-only transformer (Llama/Mistral/Qwen/Phi-3 or OPT family).

    `dtype_bytes` is the weights' and KV cache's element size; `model_type` is
    `config.json`'s (or the GGUF architecture); the RoPE, norm and bias fields are read
    by the torch model only (the cost model ignores q/k/v biases)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mlp_kind: MlpKind = "gated"  # "gated": SwiGLU, 3 matrices; "plain": 2 matrices (OPT)
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    max_model_len: int = 4096
    model_type: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ModelSpec.name must be a non-empty string, got ''")
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "dtype_bytes", "max_model_len"):
            _require_positive_int("ModelSpec", name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec.num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        if self.mlp_kind not in MLP_KINDS:
            raise ValueError(f"ModelSpec.mlp_kind must be one of {MLP_KINDS}, "
                             f"got {self.mlp_kind!r}")
        if self.head_dim % 2:
            raise ValueError(f"ModelSpec.head_dim must be even for RoPE, got {self.head_dim}")

    def with_dtype(self, dtype_bytes: int, name: str | None = None) -> ModelSpec:
        """This architecture with weights and KV of `dtype_bytes` bytes (and `name`)."""
        return replace(self, dtype_bytes=dtype_bytes, name=name or self.name)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and output projections (biases ignored)."""
        return self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size

    @property
    def mlp_params_per_layer(self) -> int:
        num_matrices = 3 if self.mlp_kind == "gated" else 2
        return num_matrices * self.hidden_size * self.intermediate_size

    @property
    def dense_params_per_layer(self) -> int:
        """Parameters of the GEMMs of one transformer block."""
        return self.attn_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: blocks, two norms per block, final norm, embedding, LM head."""
        per_layer = self.dense_params_per_layer + 2 * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * per_layer + self.hidden_size + self.embedding_params + lm_head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def streamed_weight_bytes(self) -> int:
        """Weight bytes one forward pass reads: every block, the final norm, the LM head.

        The input embedding is a gather of a few rows, so an untied embedding table is
        not streamed; a tied one is, as the LM head.
        """
        per_layer = self.dense_params_per_layer + 2 * self.hidden_size
        params = self.num_layers * per_layer + self.hidden_size + self.embedding_params
        return params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token: K and V, every layer, every KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def dense_flops_per_token(self) -> int:
        """FLOPs of the transformer blocks' dense GEMMs for one token (2 per MAC)."""
        return 2 * self.num_layers * self.dense_params_per_layer

    @property
    def lm_head_flops_per_token(self) -> int:
        """FLOPs of the LM head for one sampled row."""
        return 2 * self.hidden_size * self.vocab_size

    @property
    def attn_flops_per_pair(self) -> int:
        """FLOPs of one query-key pair over all heads and layers: QK^T and PV, 2 each."""
        return 4 * self.num_heads * self.head_dim * self.num_layers


@dataclass(frozen=True, slots=True)
class CostCoefficients:
    """Ascendra §5.1: t = c1·(tM+tF) + c2·max(tM,tF) + c3·tM + c4·tF + c5 (seconds),
    plus c6·tKV, the KV cache attention reads over the memory bandwidth (0 but where a
    calibration fits it: see andante.perf.cost_model)."""

    c1: float = 0.0
    c2: float = 1.0
    c3: float = 0.0
    c4: float = 0.0
    c5: float = 0.0
    c6: float = 0.0

    def __post_init__(self) -> None:
        for name in ("c1", "c2", "c3", "c4", "c5", "c6"):
            _require_rate("CostCoefficients", name, getattr(self, name), allow_zero=True)

    def as_tuple(self) -> tuple[float, float, float, float, float]:
        return (self.c1, self.c2, self.c3, self.c4, self.c5)

    @classmethod
    def from_dict(cls, data: Any) -> CostCoefficients:
        if not isinstance(data, dict):
            raise ValueError(f"coefficients must be an object, got {data!r}")
        unknown = sorted(set(data) - {"c1", "c2", "c3", "c4", "c5", "c6"})
        if unknown:
            raise ValueError(f"unknown coefficient keys {unknown}")
        return cls(**data)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator of an instance; rates in B/s and FLOP/s, sizes in bytes."""

    name: str
    peak_flops: float  # dense BF16/FP16 tensor FLOP/s
    mem_bandwidth: float  # device memory bandwidth, B/s
    mem_capacity: int  # device memory, bytes
    host_link_bandwidth: float  # effective host<->device copy bandwidth, one direction, B/s
    interconnect_bandwidth: float  # effective all-reduce bus bandwidth between GPUs, B/s
    coefficients: CostCoefficients = CostCoefficients()
    # A CPU engine runs steps of fewer than `serial_below_tokens` tokens on one thread
    # (andante.exec.torch_threads); a calibration fits those steps their own set
    # (andante.perf.fit.fit_by_threads). None: `coefficients` for every step.
    serial_coefficients: CostCoefficients | None = None
    serial_below_tokens: int | None = None
    # A CPU engine builds its GEMM primitives per step size (oneDNN, cached LRU): the
    # first step of a token count not among the last `new_size_cache` counts it ran
    # costs `new_size_fixed + new_size_per_token * num_tokens` seconds more
    # (andante.perf.shape_setup). 0: no such cost (GPUs, built-in profiles).
    new_size_fixed: float = 0.0
    new_size_per_token: float = 0.0
    new_size_cache: int = 0
    # An engine that captures only its decode steps as CUDA graphs launches every step
    # with prefill tokens op by op: such a step takes at least `num_layers` times this
    # (seconds), the host's time to launch it (0: launches hidden, as in every built-in
    # serving profile; andante.perf.cost_model).
    eager_launch_per_layer: float = 0.0
    # The served engine's front end, per request (andante.perf.frontend_log): seconds
    # from a request's arrival at the server to the engine taking it in (HTTP, parsing,
    # tokenization, the hop to the engine), and from the engine emitting a token to the
    # server sending it (the hop back, detokenization, SSE). The simulator delays the
    # request's arrival at its engine and each token's delivery by them. 0: no front
    # end (every built-in profile, and a profile fitted without request records).
    frontend_in: float = 0.0
    frontend_out: float = 0.0
    # A served engine's wake-up (andante.perf.idle_wake): a step that starts after the
    # engine ran no step for at least `idle_wake_after` seconds takes `idle_wake` seconds
    # more than its shape costs (vLLM CPU: threads parked, caches cold). 0: no such cost
    # (every built-in profile, and a profile fitted from a log without idle gaps).
    idle_wake: float = 0.0
    idle_wake_after: float = 0.0
    # A served engine whose step time is not linear in a step's prefill tokens (vLLM
    # CPU: its GEMM kernels change with the token count; andante.perf.prefill_factors):
    # a step with p > 0 prefill tokens costs `prefill_factors[floor(log2 p)]` times what
    # the regression predicts (1 past the table's end). Empty: no such factor (every
    # built-in profile, and a profile fitted from a log with too few prefills per size).
    prefill_factors: tuple[float, ...] = ()
    # Likewise for a step of decodes alone, d of them (a CPU engine's small-batch kernels;
    # andante.perf.decode_factors): `decode_factors[floor(log2 d)]` times the regression.
    # Empty: no such factor (every built-in profile).
    decode_factors: tuple[float, ...] = ()
    collective_latency: float = 10e-6  # fixed cost of one small all-reduce, s
    disk_bandwidth: float = 7.0e9  # model weights read from local disk, B/s (hardware.py)
    # A calibrated profile's provenance (`andante calibrate`): the fit's mean |relative
    # error| over the steps it measured, when (UTC, ISO 8601), and what it was fitted on
    # (for a step log: its source and the range of shapes it covers). None for built-ins.
    fit_error: float | None = None
    calibrated_at: str | None = None
    fitted_on: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("HardwareSpec.name must be a non-empty string, got ''")
        for name in ("peak_flops", "mem_bandwidth", "host_link_bandwidth",
                     "interconnect_bandwidth"):
            _require_rate("HardwareSpec", name, getattr(self, name))
        _require_positive_int("HardwareSpec", "mem_capacity", self.mem_capacity)
        _require_rate("HardwareSpec", "collective_latency", self.collective_latency,
                      allow_zero=True)
        _require_rate("HardwareSpec", "disk_bandwidth", self.disk_bandwidth)
        if self.fit_error is not None:
            _require_rate("HardwareSpec", "fit_error", self.fit_error, allow_zero=True)
        if not isinstance(self.coefficients, CostCoefficients):
            raise ValueError(f"HardwareSpec.coefficients must be CostCoefficients, "
                             f"got {self.coefficients!r}")
        if not isinstance(self.serial_coefficients, (CostCoefficients, type(None))):
            raise ValueError(f"HardwareSpec.serial_coefficients must be CostCoefficients or "
                             f"None, got {self.serial_coefficients!r}")
        if (self.serial_coefficients is None) != (self.serial_below_tokens is None):
            raise ValueError("HardwareSpec.serial_coefficients and serial_below_tokens go "
                             "together (both set or both None)")
        if self.serial_below_tokens is not None:
            _require_positive_int("HardwareSpec", "serial_below_tokens",
                                  self.serial_below_tokens)
        for name in ("new_size_fixed", "new_size_per_token", "eager_launch_per_layer",
                     "frontend_in", "frontend_out", "idle_wake", "idle_wake_after"):
            _require_rate("HardwareSpec", name, getattr(self, name), allow_zero=True)
        if self.new_size_cache != 0:
            _require_positive_int("HardwareSpec", "new_size_cache", self.new_size_cache)
        for name in ("prefill_factors", "decode_factors"):
            factors = getattr(self, name)
            if not isinstance(factors, tuple):
                raise ValueError(f"HardwareSpec.{name} must be a tuple of numbers, got "
                                 f"{factors!r}")
            for index, factor in enumerate(factors):
                _require_rate("HardwareSpec", f"{name}[{index}]", factor)

    def with_coefficients(self, coefficients: CostCoefficients) -> HardwareSpec:
        return replace(self, coefficients=coefficients)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = HARDWARE_JSON_VERSION
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> HardwareSpec:
        if not isinstance(data, dict):
            raise ValueError(f"a hardware profile must be a JSON object, got {data!r}")
        data = dict(data)
        version = data.pop("version", HARDWARE_JSON_VERSION)
        if version != HARDWARE_JSON_VERSION:
            raise ValueError(f"unsupported hardware profile version {version!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown hardware profile keys {unknown}")
        missing = sorted(known - set(data) - {"coefficients", "collective_latency",
                                               "disk_bandwidth", "fit_error",
                                               "calibrated_at", "serial_coefficients",
                                               "serial_below_tokens", "new_size_fixed",
                                               "new_size_per_token", "new_size_cache",
                                               "eager_launch_per_layer", "fitted_on",
                                               "frontend_in", "frontend_out",
                                               "idle_wake", "idle_wake_after",
                                               "prefill_factors", "decode_factors"})
        if missing:
            raise ValueError(f"hardware profile lacks keys {missing}")
        if "coefficients" in data:
            data["coefficients"] = CostCoefficients.from_dict(data["coefficients"])
        for name in ("prefill_factors", "decode_factors"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        if data.get("serial_coefficients") is not None:
            data["serial_coefficients"] = CostCoefficients.from_dict(
                data["serial_coefficients"])
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> HardwareSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"hardware profile is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
