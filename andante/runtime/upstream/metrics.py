"""An upstream's load from its Prometheus `/metrics` text.

vLLM names the figures `vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc` (v1; `vllm:gpu_cache_usage_perc` before it, a fraction
despite its name); andante's server exports the same names (and its own `andante:`
ones, read here too). Each is summed over its label sets (one per served model; KV
usage: the largest). A figure the text lacks stays None: the caller falls back on what
it counts itself.
"""

from __future__ import annotations

from dataclasses import dataclass

_PREFIXES = ("vllm:", "andante:")
_RUNNING = "num_requests_running"
_WAITING = "num_requests_waiting"
_KV_NAMES = ("kv_cache_usage_perc", "gpu_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class UpstreamLoad:
    """Requests running and waiting on the upstream, its KV usage (0..1)."""

    num_running: int | None = None
    num_waiting: int | None = None
    kv_usage: float | None = None


def _sample(line: str) -> tuple[str, float] | None:
    """(metric name without labels, value) of one sample line, None for other lines."""
    if not line or line[0] == "#":
        return None
    name_end = line.find("{")
    if name_end < 0:
        name, _, rest = line.partition(" ")
    else:
        name = line[:name_end]
        rest = line[line.rfind("}") + 1:]
    fields = rest.split()
    if not fields:
        return None
    try:
        return name, float(fields[0])
    except ValueError:
        return None


def parse_load(text: str) -> UpstreamLoad:
    """The load figures in a Prometheus exposition `text` (see the module note)."""
    sums: dict[str, float] = {}
    kv: float | None = None
    for line in text.splitlines():
        sample = _sample(line.strip())
        if sample is None:
            continue
        name, value = sample
        prefix = next((p for p in _PREFIXES if name.startswith(p)), None)
        if prefix is None:
            continue
        short = name[len(prefix):]
        if short in (_RUNNING, _WAITING):
            key = prefix + short
            sums[key] = sums.get(key, 0.0) + value
        elif short in _KV_NAMES:
            kv = value if kv is None else max(kv, value)
    return UpstreamLoad(_first(sums, _RUNNING), _first(sums, _WAITING),
                        None if kv is None else min(1.0, max(0.0, kv)))


def _first(sums: dict[str, float], short: str) -> int | None:
    for prefix in _PREFIXES:  # vLLM's names first: andante exports both
        value = sums.get(prefix + short)
        if value is not None:
            return max(0, round(value))
    return None
