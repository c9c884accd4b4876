"""Server options, and the one place the server reads environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from andante.cluster.registry import engine_policy_for, router_entry
from andante.core.request import PreemptionMode

TOY_MODEL = "toy"
BACKENDS = ("inprocess", "process", "ray")
API_KEY_ENV_VAR = "ANDANTE_API_KEY"
DEV_MODE_ENV_VAR = "ANDANTE_SERVER_DEV_MODE"  # as vLLM's VLLM_SERVER_DEV_MODE


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Engine limits (vLLM's names). `max_model_len` None: the model's own context;
    KV cache: `num_kv_blocks` blocks if given, else `kv_cache_gib` GiB (real model; None:
    sized from the model and the machine, `andante.server.kv_budget`) or 4096 blocks
    (toy); `swap_space_gib`: host tier for swapped-out KV."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE
    num_kv_blocks: int | None = None
    kv_cache_gib: float | None = None
    swap_space_gib: float = 0.25
    dtype: str = "float32"  # on a CPU exact and (without bf16 units) faster than bfloat16
    num_threads: int | None = None
    toy_step_time: float = 0.005
    enable_prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class HTTPLimits:
    """The HTTP edge: the largest request body (413 beyond), the seconds a client may
    take to send its request headers and then its body (408 beyond; `upload_timeout`
    for `POST /v1/files`), how many uploads may be received at once (429 beyond), and
    whether `/metrics`, `/`, `/api/stats` and `/openapi.json` stay open when an API key
    is set."""

    max_body_bytes: int = 4 << 20
    max_file_bytes: int = 200 << 20  # POST /v1/files (OpenAI's limit for a batch file)
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    upload_timeout: float = 300.0
    max_uploads: int = 2  # uploads received at once (each goes to a temporary file)
    public_metrics: bool = False

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_file_bytes", "max_uploads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "upload_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """The Batch API's durable queue (andante.runtime.durable). `queue`: "sqlite" (a file
    in `state_dir`; None: a temporary directory, removed at exit, so nothing survives a
    restart; `andante serve` defaults to a directory under the user's cache) or
    "redis://HOST:PORT" (one queue for several servers; `consumer`: this server's name
    in the consumer group, default host-pid; `claim_idle_s`: a consumer's entries idle
    this long are taken over by another). `max_in_flight`: batch requests on the
    engines at once (None: a quarter of max_num_seqs per instance)."""

    queue: str = "sqlite"
    state_dir: str | None = None
    max_in_flight: int | None = None
    claim_idle_s: float = 30.0
    consumer: str | None = None
    # files without their own `expires_after` (uploads, batch outputs) are deleted this
    # long after their creation (None: kept forever); OpenAI's default for batch files
    file_retention_s: float | None = 30 * 86400.0

    def __post_init__(self) -> None:
        if self.queue != "sqlite" and not self.queue.startswith(("redis://", "rediss://",
                                                                 "unix://")):
            raise ValueError(f"queue must be 'sqlite' or redis://HOST:PORT, got {self.queue!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if not self.claim_idle_s > 0:
            raise ValueError(f"claim_idle_s must be > 0, got {self.claim_idle_s}")
        if self.file_retention_s is not None and not self.file_retention_s > 0:
            raise ValueError(f"file_retention_s must be > 0, got {self.file_retention_s}")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """model: None for the embedded default, "toy" for the byte-level toy backend
    (no weights; for tests and demos), else a model path."""

    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    # several tenants (a keys file): (name, key) pairs; files and batches belong to the
    # name of the key that made them and only it sees them (`api_key` alone: one tenant)
    api_keys: tuple[tuple[str, str], ...] = ()
    policy: str = ""  # "": the router's engine policy (QLM: qlm-edf), else vllm
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    max_queued: int = 256
    engine: EngineOptions = field(default_factory=EngineOptions)
    log_level: str = "info"
    # the instances behind the cluster controller (andante.server.backend)
    instances: int = 1
    backend: str = "inprocess"  # "process" or "ray" (`andante serve`: process by default)
    router: str = "round-robin"
    router_options: Mapping[str, Any] = field(default_factory=dict)
    hp_instances: int = 1  # a router with pools (ascendra): the size of the HP pool
    ray_address: str = "local"  # "local" (embedded), "auto" or "ray://HOST:PORT"
    max_restarts: int = 3  # Ray actor restarts per instance
    limits: HTTPLimits = field(default_factory=HTTPLimits)
    # several models (`--model NAME=PATH`, in order; path None: the embedded model):
    # when given, `model` and `served_model_name` are unused
    models: tuple[tuple[str, str | None], ...] = ()
    host_memory_gib: float | None = None  # cap on the warm models' host copies
    batch: BatchOptions = field(default_factory=BatchOptions)
    # debugging: each instance's step and request trace (andante.runtime.step_trace),
    # written to this file (instance i > 0: FILE.i)
    trace_steps: str | None = None
    # vLLM's dev mode: /sleep, /wake_up, /is_sleeping (andante.server.sleep)
    dev_mode: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy",  # a conflicting --policy: a one-line error
                           engine_policy_for(self.router, self.policy or None) or "vllm")
        self._check_models()
        self._check_keys()
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got "
                             f"{self.backend!r}")
        if self.dev_mode and self.backend != "inprocess":
            raise ValueError(f"--dev-mode (sleep mode) needs --backend inprocess, got "
                             f"{self.backend!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {self.max_queued}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")


    def _check_keys(self) -> None:
        if self.api_keys and self.api_key is not None:
            raise ValueError("give either one API key (single-tenant) or a keys file, not both")
        names = [name for name, _ in self.api_keys]
        keys = [key for _, key in self.api_keys]
        if len(set(names)) != len(names) or len(set(keys)) != len(keys):
            raise ValueError("the keys file has a name or a key twice; each tenant needs "
                             "its own of both")

    @property
    def keys_by_value(self) -> dict[bytes, str | None]:
        """Every accepted key (UTF-8) -> its tenant's name (None: the single key)."""
        if self.api_key is not None:
            return {self.api_key.encode("utf-8"): None}
        return {key.encode("utf-8"): name for name, key in self.api_keys}

    def _check_models(self) -> None:
        names = [name for name, _ in self.models]
        if any(not name for name in names):
            raise ValueError(f"every model needs a name (NAME=PATH), got {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if self.models and self.backend == "process":
            raise ValueError("backend 'process' serves one model; several models run on "
                             "backend 'inprocess' or 'ray'")
        if self.models and not router_entry(self.router).several_models:
            raise ValueError(f"router {self.router!r} is not available with several models")
        if self.host_memory_gib is not None and self.host_memory_gib < 0:
            raise ValueError(f"host_memory_gib must be >= 0, got {self.host_memory_gib}")


def read_keys_file(path: str) -> tuple[tuple[str, str], ...]:
    """`NAME KEY` per line (`#` comments and blank lines skipped) -> (name, key) pairs;
    a `ValueError` naming the line if one is malformed."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ValueError(f"cannot read the keys file {path}: {exc.strerror}") from None
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"{path}, line {number}: expected 'NAME KEY', got "
                             f"{len(fields)} fields")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise ValueError(f"the keys file {path} has no keys")
    return tuple(pairs)


def env_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Defaults taken from the environment: $ANDANTE_API_KEY for --api-key,
    $ANDANTE_SERVER_DEV_MODE ("1": on) for --dev-mode."""
    env = os.environ if environ is None else environ
    return {"api_key": env.get(API_KEY_ENV_VAR) or None,
            "dev_mode": "1" if env.get(DEV_MODE_ENV_VAR, "") == "1" else None}
