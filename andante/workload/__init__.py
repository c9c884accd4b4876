"""Workloads: arrival processes, length distributions, trace replay and SLO assignment.

`build_workload(WorkloadConfig(...))` is the one-call entry point; the pieces (arrival
generators, the length samplers of `lengths`, `load_trace`, `assign_slos`) are
usable on their own.
"""

from andante.workload import arrivals, lengths
from andante.workload.arrivals import burst_rates, cyclic_burst, gamma, poisson
from andante.workload.builder import (
    KINDS,
    LENGTH_KINDS,
    TRACES_ENV_VAR,
    LengthSpec,
    WorkloadConfig,
    build_workload,
    build_workload_traced,
    parse_kind,
    parse_lengths,
    resolve_traces_dir,
)
from andante.workload.formats import KNOWN_FORMATS, TraceColumns, parse_trace_columns
from andante.workload.slo import (
    READING,
    READING_LISTENING,
    DiscreteDistribution,
    SLOConfig,
    assign_slos,
    sample_tds,
    ttft_targets,
)
from andante.workload.spec import RequestSpec, to_request, to_requests
from andante.workload.traces import Trace, load_trace, parse_timestamp_ns

__all__ = [
    "KINDS",
    "KNOWN_FORMATS",
    "LENGTH_KINDS",
    "READING",
    "READING_LISTENING",
    "TRACES_ENV_VAR",
    "DiscreteDistribution",
    "LengthSpec",
    "RequestSpec",
    "SLOConfig",
    "Trace",
    "TraceColumns",
    "WorkloadConfig",
    "arrivals",
    "assign_slos",
    "build_workload",
    "build_workload_traced",
    "burst_rates",
    "cyclic_burst",
    "gamma",
    "lengths",
    "load_trace",
    "parse_kind",
    "parse_lengths",
    "parse_timestamp_ns",
    "parse_trace_columns",
    "poisson",
    "resolve_traces_dir",
    "sample_tds",
    "to_request",
    "to_requests",
    "ttft_targets",
]
