"""A simulated cluster described by a TOML file (`andante simulate --cluster FILE`).

Top-level keys override the command line's uniform cluster (`model`, `hardware`, `tp`,
`policy`, `router`, `models`: the registry every instance may load, `host_memory_gib`),
with optional tables `[router_options]` and `[policy_options]`; each `[[instances]]`
entry describes `count` identical instances (default 1) by `hardware`, `model`, `tp`,
`warm` (models in host memory at the start), `policy` and `role`. Example:

    router = "qlm"
    models = ["mistral-7b", "vicuna-13b"]
    [[instances]]
    hardware = "a100-80g"
    model = "mistral-7b"
    count = 2
    [[instances]]
    hardware = "a10-24g"
    model = "vicuna-13b"
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from andante.core.toml_doc import read_toml_table
from andante.perf.catalog import get_hardware, get_model
from andante.sim.spec import ClusterSpec, InstanceSpec

_TOP_KEYS = frozenset({"model", "hardware", "tp", "policy", "router", "models",
                       "host_memory_gib", "router_options", "policy_options", "instances"})
_INSTANCE_KEYS = frozenset({"hardware", "model", "tp", "warm", "policy", "role", "count"})


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of model names, got {value!r}")
    for name in value:
        get_model(name)
    return tuple(value)


def _instances(entry: Any, position: int) -> list[InstanceSpec]:
    if not isinstance(entry, dict):
        raise ValueError(f"instances[{position}] must be a table, got {entry!r}")
    unknown = sorted(set(entry) - _INSTANCE_KEYS)
    if unknown:
        raise ValueError(f"instances[{position}]: unknown key(s) {unknown}")
    count = entry.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"instances[{position}].count must be a positive integer, got {count!r}")
    if "hardware" in entry:
        get_hardware(entry["hardware"])
    if "model" in entry:
        get_model(entry["model"])
    one = InstanceSpec(role=entry.get("role", ""), policy=entry.get("policy"),
                       model=entry.get("model"), hardware=entry.get("hardware"),
                       tp=entry.get("tp"), warm=_names(entry.get("warm", []),
                                                       f"instances[{position}].warm"))
    return [one] * count


def cluster_from_toml(text: str, base: ClusterSpec) -> ClusterSpec:
    """`base` (the command line's cluster) with what the TOML document `text` sets."""
    doc = read_toml_table(text, _TOP_KEYS, "cluster file")
    changes: dict[str, Any] = {k: doc[k] for k in ("model", "hardware", "tp", "policy",
                                                   "router", "host_memory_gib") if k in doc}
    if "models" in doc:
        changes["models"] = _names(doc["models"], "models")
    for key in ("router_options", "policy_options"):
        if key in doc:
            changes[key] = dict(doc[key])
    entries = doc.get("instances", [])
    if not isinstance(entries, list):
        raise ValueError(f"instances must be an array of tables, got {entries!r}")
    members = [inst for i, entry in enumerate(entries) for inst in _instances(entry, i)]
    if members:
        changes.update(instances=tuple(members), num_instances=len(members))
    return dataclasses.replace(base, **changes)


def load_cluster_file(path: Path, base: ClusterSpec) -> ClusterSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read cluster file {path}: {exc.strerror}") from exc
    return cluster_from_toml(text, base)
