"""A workload from one frozen config: arrivals × lengths × SLOs, reproducible by seed.

`WorkloadConfig.kind` picks the arrivals: "poisson", "gamma" (rate, cv), "burst" (Andes'
cyclic bursts: rate = the cycle's mean rate, burst_intensity, burst_share,
cycle_length), "azure-conv" / "azure-code" (replay of the Azure 2023 traces under
`traces_dir`) or "trace:<path>" (replay of a CSV or JSONL trace in any format of
`andante.workload.formats`, or mapped by `trace_columns`).
`lengths` picks the lengths (see `parse_lengths`). `prefix_sharing` makes prompts share
prefixes (`andante.workload.prefix`); a replayed trace's own block hash ids (Mooncake)
come with its own lengths. `rate_scale` multiplies the request
rate of every kind (a trace replays rate_scale× faster). Synthetic kinds stop at
`num_requests` or `duration` s, whichever comes first; traces are cut the same way
(None for both replays the whole trace). `model_mix` ("NAME:WEIGHT,...", QLM's
multi-model workloads) gives each request a model drawn by weight, seeded by `seed`.

Arrivals, lengths and SLOs draw from three independent streams spawned from `seed`, so
the same config gives the same workload, and changing e.g. the length distribution
leaves the arrival times unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from andante.workload import lengths as length_samplers
from andante.workload.arrivals import burst_rates, cyclic_burst, gamma, poisson
from andante.workload.formats import TraceColumns, parse_trace_columns
from andante.workload.mixes import assign_models, parse_model_mix
from andante.workload.prefix import apply_prefix_sharing, parse_prefix_sharing, with_trace_ids
from andante.workload.slo import SLOConfig, assign_slos
from andante.workload.spec import RequestSpec
from andante.workload.traces import Trace, load_trace

TRACES_ENV_VAR = "ANDANTE_TRACES"
DEFAULT_TRACES_DIR = Path("..") / "shared" / "traces"
TRACE_FILES: Mapping[str, Path] = MappingProxyType(
    {
        "azure-conv": Path("azure_llm_2023") / "AzureLLMInferenceTrace_conv.csv",
        "azure-code": Path("azure_llm_2023") / "AzureLLMInferenceTrace_code.csv",
    }
)
SHAREGPT_FILE = Path("sharegpt_lengths") / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
SYNTHETIC_KINDS = ("poisson", "gamma", "burst")
KINDS = (*SYNTHETIC_KINDS, *TRACE_FILES, "trace:<path>")
LENGTH_KINDS = (
    "sharegpt",
    "sharegpt:<path>",
    "fixed:P:O",
    "uniform:a:b:c:d",
    "trace",
    "azure-conv",
    "azure-code",
    "trace:<path>",
)


def resolve_traces_dir(
    traces_dir: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """The traces folder: `traces_dir` if given, else $ANDANTE_TRACES, else
    ../shared/traces relative to the current working directory (the folder beside the
    repository when run from its root). The only place the environment is read."""
    if traces_dir is not None:
        return Path(traces_dir)
    env = os.environ if environ is None else environ
    from_env = env.get(TRACES_ENV_VAR, "")
    return Path(from_env) if from_env else Path.cwd() / DEFAULT_TRACES_DIR


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A parsed `lengths` string: kind, integer parameters, optional file path."""

    kind: str
    params: tuple[int, ...] = ()
    path: str | None = None


def _parse_ints(text: str, count: int, form: str) -> tuple[int, ...]:
    parts = text.split(":")[1:]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(f"lengths {text!r}: expected whole numbers, as in {form!r}") from None
    if len(values) != count:
        raise ValueError(f"lengths {text!r}: expected {count} numbers, as in {form!r}")
    return values


def parse_lengths(text: str) -> LengthSpec:
    """Parse a lengths string; ValueError with the accepted forms if it is malformed.

    "sharegpt[:<path>]", "fixed:P:O", "uniform:a:b:c:d" (prompt in [a, b], output in
    [c, d], inclusive), "trace" (the replayed trace's own lengths, trace kinds only),
    "azure-conv", "azure-code", "trace:<path>" (lengths sampled from a trace in any
    known format, or mapped by `trace_columns`; arrivals ignored).
    """
    head, _, rest = text.partition(":")
    if head == "fixed":
        spec = LengthSpec("fixed", _parse_ints(text, 2, "fixed:128:64"))
        if min(spec.params) < 1:
            raise ValueError(f"lengths {text!r}: fixed lengths must be >= 1")
        return spec
    if head == "uniform":
        spec = LengthSpec("uniform", _parse_ints(text, 4, "uniform:64:512:16:256"))
        a, b, c, d = spec.params
        if not (1 <= a <= b and 1 <= c <= d):
            raise ValueError(f"lengths {text!r}: need 1 <= a <= b and 1 <= c <= d")
        return spec
    if head in ("sharegpt", "trace") and rest:
        return LengthSpec(head, path=rest)
    if not rest and head in ("sharegpt", "trace", *TRACE_FILES):
        return LengthSpec(head)
    raise ValueError(f"unknown lengths {text!r}; expected one of {', '.join(LENGTH_KINDS)}")


def parse_kind(kind: str) -> tuple[str, str | None]:
    """("poisson", None), ..., ("azure-conv", None), ("trace", "<path>")."""
    if kind in SYNTHETIC_KINDS or kind in TRACE_FILES:
        return kind, None
    if kind.startswith("trace:") and len(kind) > len("trace:"):
        return "trace", kind[len("trace:") :]
    raise ValueError(f"unknown workload kind {kind!r}; expected one of {', '.join(KINDS)}")


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What to build (validated on creation; see the module note for the kinds).

    rate: requests/s of the synthetic kinds (for "burst", the mean over a cycle);
    ignored by trace kinds, whose rate is the trace's own times `rate_scale`.
    cv: Gamma inter-arrival coefficient of variation. burst_*, cycle_length: Andes'
    cyclic bursts (intensity relative to `rate`, share of each cycle, seconds).
    num_requests / duration: count and time bounds (s), whichever comes first.
    lengths: see `parse_lengths`; max_context filters sampled rows (prompt + output).
    slo: per-request SLO assignment. traces_dir: see `resolve_traces_dir`.
    model, priority: copied onto every request. trace_columns: an explicit column mapping
    ("time=...,prompt=...,output=...[,unit=ms]") for the files named by "trace:<path>".
    model_mix: "NAME:WEIGHT,..." (weights normalised): each request's model drawn by
    weight instead of `model`.
    """

    kind: str = "poisson"
    rate: float = 1.0
    cv: float = 1.0
    burst_intensity: float = 2.0
    burst_share: float = 0.35
    cycle_length: float = 1200.0
    num_requests: int | None = 1000
    duration: float | None = None
    lengths: str = "sharegpt"
    max_context: int | None = None
    rate_scale: float = 1.0
    seed: int = 0
    slo: SLOConfig = SLOConfig()
    traces_dir: str | None = None
    model: str = ""
    priority: int = 0
    trace_columns: str | None = None
    prefix_sharing: str | None = None  # andante.workload.prefix: system:N, conversation:C
    model_mix: str | None = None

    def __post_init__(self) -> None:
        kind, _ = parse_kind(self.kind)
        if self.prefix_sharing is not None:
            parse_prefix_sharing(self.prefix_sharing)
        self.columns()
        if self.model_mix is not None:
            parse_model_mix(self.model_mix)
            if self.model:
                raise ValueError(f"give model ({self.model!r}) or model_mix, not both")
        for name in ("rate", "cv", "cycle_length", "rate_scale"):
            _check_positive(name, getattr(self, name))
        if kind == "burst":
            burst_rates(self.rate, self.burst_intensity, self.burst_share)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed!r}")
        if self.num_requests is not None and self.num_requests < 0:
            raise ValueError(f"num_requests must be >= 0, got {self.num_requests!r}")
        if self.duration is not None and not (math.isfinite(self.duration) and self.duration >= 0):
            raise ValueError(f"duration must be finite and >= 0, got {self.duration!r}")
        if kind in SYNTHETIC_KINDS and self.num_requests is None and self.duration is None:
            raise ValueError(f"kind {self.kind!r} needs num_requests or duration")
        lengths = parse_lengths(self.lengths)
        if lengths.kind == "trace" and lengths.path is None and kind in SYNTHETIC_KINDS:
            raise ValueError(
                f"lengths 'trace' reuses a replayed trace's lengths, but kind {self.kind!r} "
                "is synthetic; use lengths azure-conv, azure-code or trace:<path> to sample "
                "a trace's lengths"
            )
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context!r}")

    def columns(self) -> TraceColumns | None:
        """The parsed `trace_columns` mapping (None: recognise the columns by name)."""
        return None if self.trace_columns is None else parse_trace_columns(self.trace_columns)

    def trace_path(self, name: str) -> Path:
        """The file of a named trace ("azure-conv", "azure-code", "sharegpt")."""
        relative = SHAREGPT_FILE if name == "sharegpt" else TRACE_FILES[name]
        return resolve_traces_dir(self.traces_dir) / relative


def _arrivals(cfg: WorkloadConfig, rng: np.random.Generator) -> tuple[np.ndarray, Trace | None]:
    kind, path = parse_kind(cfg.kind)
    rate = cfg.rate * cfg.rate_scale
    num, duration = cfg.num_requests, cfg.duration
    if kind == "poisson":
        return poisson(rate, num, rng, duration=duration), None
    if kind == "gamma":
        return gamma(rate, cfg.cv, num, rng, duration=duration), None
    if kind == "burst":
        times = cyclic_burst(
            rate,
            cfg.burst_intensity,
            cfg.burst_share,
            cfg.cycle_length,
            num,
            rng,
            duration=duration,
        )
        return times, None
    file, columns = (Path(path), cfg.columns()) if path is not None else (
        cfg.trace_path(kind), None)
    trace = load_trace(file, cfg.rate_scale, num, duration, columns)
    return trace.arrival_times, trace


def _lengths(
    cfg: WorkloadConfig, num: int, trace: Trace | None, rng: np.random.Generator
) -> length_samplers.Lengths:
    spec = parse_lengths(cfg.lengths)
    if spec.kind == "fixed":
        return length_samplers.fixed(spec.params[0], spec.params[1], num)
    if spec.kind == "uniform":
        a, b, c, d = spec.params
        return length_samplers.uniform((a, b), (c, d), num, rng)
    if spec.kind == "sharegpt":
        file = Path(spec.path) if spec.path else cfg.trace_path("sharegpt")
        return length_samplers.sharegpt(file, num, rng, cfg.max_context)
    if spec.kind == "trace" and spec.path is None:
        assert trace is not None  # WorkloadConfig rejects 'trace' with synthetic arrivals
        return trace.prompt_lens, trace.output_lens
    if spec.path:
        return length_samplers.from_trace(spec.path, num, rng, cfg.max_context, cfg.columns())
    return length_samplers.from_trace(cfg.trace_path(spec.kind), num, rng, cfg.max_context)


def build_workload(cfg: WorkloadConfig) -> list[RequestSpec]:
    """The workload `cfg` describes, sorted by arrival time; same cfg ⇒ same list."""
    return build_workload_traced(cfg)[0]


def build_workload_traced(cfg: WorkloadConfig) -> tuple[list[RequestSpec], Trace | None]:
    """`build_workload`, with the replayed trace (None for synthetic arrivals)."""
    arrival_rng, length_rng, slo_rng = (
        np.random.default_rng(seed) for seed in np.random.SeedSequence(cfg.seed).spawn(3)
    )
    times, trace = _arrivals(cfg, arrival_rng)
    prompts, outputs = _lengths(cfg, len(times), trace, length_rng)
    slos = assign_slos(prompts, outputs, cfg.slo, slo_rng)
    specs = [
        RequestSpec(
            arrival_time=float(times[i]),
            prompt_len=int(prompts[i]),
            output_len=int(outputs[i]),
            slo=slos[i],
            priority=cfg.priority,
            model=cfg.model,
        )
        for i in range(len(times))
    ]
    if trace is not None and _lengths_are_the_traces(cfg):
        specs = with_trace_ids(specs, trace)  # its block hash ids, row for row
    specs = apply_prefix_sharing(specs, cfg.prefix_sharing, cfg.max_context)
    if cfg.model_mix is not None:
        specs = assign_models(specs, parse_model_mix(cfg.model_mix), cfg.seed)
    return specs, trace


def _lengths_are_the_traces(cfg: WorkloadConfig) -> bool:
    spec = parse_lengths(cfg.lengths)
    return spec.kind == "trace" and spec.path is None
