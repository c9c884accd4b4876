"""The fleet at start: which upstreams, what each serves, and the bad input refused.

An upstream is given by its base URL (`--upstream URL`, or a `[[instances]]` entry with
`url` in a fleet file: the TOML format `andante simulate --cluster` reads; there an
instance's catalog `model` and `hardware` name the cost model a queue router (qlm)
estimates the upstream with, and `tp`, `policy`, `warm` are ignored). At start each
upstream's `/v1/models` is read: its models, and its kind from their `owned_by`
("vllm", "andante", else "openai": a server that gets no SLO fields).
Refused, each with one line naming the upstream: an upstream that does not answer,
one that serves no model, and a model served under two names (the same `root`, vLLM's
path of the weights, behind two ids) — requests for one name would never be balanced
with the other's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from andante.core.toml_doc import read_toml_table
from andante.perf.catalog import get_hardware, get_model

KINDS = ("vllm", "andante", "openai")
_FILE_TOP_KEYS = frozenset({"model", "hardware", "tp", "policy", "router", "models",
                            "host_memory_gib", "router_options", "policy_options",
                            "instances", "poll_interval"})
_FILE_INSTANCE_KEYS = frozenset({"hardware", "model", "tp", "warm", "policy", "role",
                                 "count", "url", "max_num_seqs", "kind", "device"})


class FleetError(ValueError):
    """Bad fleet input; the message is the one startup line."""


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """One upstream as configured: its URL, role (ascendra: "lp"/"hp"), the requests it
    runs at once (its `--max-num-seqs`: the capacity routers read) and its kind (None:
    from its /v1/models)."""

    url: str
    role: str = ""
    max_num_seqs: int = 64
    kind: str | None = None
    cost_model: str = "smollm2-135m"  # catalog names (andante.perf.catalog): the cost
    hardware: str = "a10-24g"  # model a queue router (qlm) estimates this upstream with
    device: str = ""  # upstreams naming one device share it: QLM swaps their models

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise FleetError(f"upstream {self.url!r}: the URL must start with http:// or "
                             "https://")
        if self.max_num_seqs < 1:
            raise FleetError(f"upstream {self.url}: max_num_seqs must be >= 1, got "
                             f"{self.max_num_seqs}")
        try:
            get_model(self.cost_model)
            get_hardware(self.hardware)
        except (KeyError, ValueError) as exc:
            raise FleetError(f"upstream {self.url}: {exc}") from None
        if self.kind is not None and self.kind not in KINDS:
            raise FleetError(f"upstream {self.url}: kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")


@dataclass(frozen=True, slots=True)
class FleetFile:
    upstreams: tuple[UpstreamSpec, ...]
    router: str | None = None
    router_options: Mapping[str, Any] = field(default_factory=dict)
    poll_interval: float | None = None


@dataclass(frozen=True, slots=True)
class UpstreamInfo:
    """What an upstream said at start: its models (ids) and kind."""

    spec: UpstreamSpec
    models: tuple[str, ...]
    kind: str
    max_model_len: int | None = None
    sleeping: bool = False  # a device's upstream: asleep at start (GET /is_sleeping)

    @property
    def url(self) -> str:
        return self.spec.url


def base_url(url: str) -> str:
    """`url` without a trailing slash or `/v1` (both forms are accepted)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _file_instance(entry: Any, position: int) -> UpstreamSpec:
    if not isinstance(entry, dict):
        raise FleetError(f"fleet file: instances[{position}] must be a table, got {entry!r}")
    unknown = sorted(set(entry) - _FILE_INSTANCE_KEYS)
    if unknown:
        raise FleetError(f"fleet file: instances[{position}]: unknown key(s) {unknown}")
    if "url" not in entry:
        raise FleetError(f"fleet file: instances[{position}] needs a url")
    if entry.get("count", 1) != 1:
        raise FleetError(f"fleet file: instances[{position}]: an upstream is one instance "
                         f"(count 1), got count {entry['count']!r}")
    costs = {k: str(entry[v]) for k, v in (("cost_model", "model"), ("hardware", "hardware"))
             if v in entry}
    return UpstreamSpec(url=base_url(str(entry["url"])), role=str(entry.get("role", "")),
                        max_num_seqs=int(entry.get("max_num_seqs", 64)),
                        kind=entry.get("kind"), device=str(entry.get("device", "")), **costs)


def parse_fleet_file(text: str) -> FleetFile:
    """The upstreams (and router) of a fleet file's TOML `text`."""
    doc = read_toml_table(text, _FILE_TOP_KEYS, "fleet file", FleetError)
    entries = doc.get("instances", [])
    if not isinstance(entries, list) or not entries:
        raise FleetError("fleet file: needs [[instances]] entries, each with a url")
    poll = doc.get("poll_interval")
    return FleetFile(tuple(_file_instance(e, i) for i, e in enumerate(entries)),
                     doc.get("router"), dict(doc.get("router_options", {})),
                     None if poll is None else float(poll))


def load_fleet_file(path: Path) -> FleetFile:
    try:
        return parse_fleet_file(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {path}: {exc.strerror}") from exc


def _kind(entries: Sequence[Mapping[str, Any]]) -> str:
    owners = {str(e.get("owned_by", "")) for e in entries}
    for kind in ("andante", "vllm"):
        if kind in owners:
            return kind
    return "openai"


async def describe(client: httpx.AsyncClient, spec: UpstreamSpec, timeout: float
                   ) -> tuple[UpstreamInfo, list[Mapping[str, Any]]]:
    """Read one upstream's /v1/models (FleetError with one line if it cannot)."""
    try:
        resp = await client.get(f"{spec.url}/v1/models", timeout=timeout)
    except httpx.HTTPError as exc:
        raise FleetError(f"upstream {spec.url} is unreachable: "
                         f"{type(exc).__name__} {exc}".rstrip()) from None
    if resp.status_code != 200:
        raise FleetError(f"upstream {spec.url}: GET /v1/models answered {resp.status_code}")
    try:
        entries: list[Mapping[str, Any]] = [
            e for e in resp.json()["data"] if isinstance(e, dict) and e.get("id")]
    except (ValueError, KeyError, TypeError):
        raise FleetError(f"upstream {spec.url}: /v1/models is not an OpenAI model "
                         "list") from None
    if not entries:
        raise FleetError(f"upstream {spec.url} serves no model")
    lens = [e["max_model_len"] for e in entries if isinstance(e.get("max_model_len"), int)]
    info = UpstreamInfo(spec, tuple(str(e["id"]) for e in entries),
                        spec.kind or _kind(entries), min(lens) if lens else None,
                        await _sleeping(client, spec, timeout) if spec.device else False)
    if spec.device and len(info.models) != 1:
        raise FleetError(f"upstream {spec.url} shares device {spec.device!r} but serves "
                         f"{len(info.models)} models: a device's servers serve one each")
    return info, entries


async def _sleeping(client: httpx.AsyncClient, spec: UpstreamSpec, timeout: float) -> bool:
    """Whether a device's upstream sleeps now (FleetError if it has no sleep mode)."""
    hint = ("start vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode, andante with "
            "--dev-mode")
    try:
        resp = await client.get(f"{spec.url}/is_sleeping", timeout=timeout)
        if resp.status_code == 200:
            return bool(resp.json()["is_sleeping"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass
    raise FleetError(f"upstream {spec.url} shares device {spec.device!r} but has no sleep "
                     f"mode (GET /is_sleeping failed): {hint}")


def _check_names(described: Sequence[tuple[UpstreamInfo, list[Mapping[str, Any]]]]) -> None:
    """A model (its `root`) under two ids anywhere in the fleet is refused."""
    names: dict[str, tuple[str, str]] = {}  # root -> (id, url)
    for info, entries in described:
        for entry in entries:
            root = entry.get("root")
            if not root:
                continue
            seen = names.setdefault(str(root), (str(entry["id"]), info.url))
            if seen[0] != entry["id"]:
                raise FleetError(f"model {root} is served as {seen[0]!r} by {seen[1]} and "
                                 f"as {entry['id']!r} by {info.url}: serve it under one "
                                 "name (--served-model-name)")


async def discover(specs: Sequence[UpstreamSpec], timeout: float = 5.0
                   ) -> list[UpstreamInfo]:
    """Every upstream's models and kind, in order (FleetError on bad input)."""
    if not specs:
        raise FleetError("no upstream given")
    urls = [s.url for s in specs]
    if len(set(urls)) != len(urls):
        raise FleetError(f"an upstream is listed twice: {urls}")
    async with httpx.AsyncClient() as client:
        described = await asyncio.gather(*(describe(client, s, timeout) for s in specs))
    _check_names(described)
    return [info for info, _ in described]
