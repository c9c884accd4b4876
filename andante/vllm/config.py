"""Settings of andante's scheduler class in vLLM, and the checks it runs at startup.

The settings come from vLLM's `--additional-config '{"andante": {...}}'`:

- `policy` (default "andes"): one of POLICIES, andante's registered policies that run
  inside vLLM;
- `policy_options` (object): the policy's tunables, as `andante serve --policy-option`;
- `hardware`: an andante hardware profile (e.g. h100-80g, or one `andante calibrate`
  saved) for the policies' cost model; on vLLM's CPU build the `cpu` profile is the
  default, elsewhere policies that need a cost model (ascendra-lp/-hp) refuse to start
  without it;
- `step_log`: a file the scheduler appends its step log to (andante.perf.step_log's
  format, what `andante calibrate --step-log` fits);
- `log_interval` (seconds, default 10; 0: never): how often the policy's state is
  logged while requests are in flight.

Every problem is a `ConfigError` with one line naming it: an unknown key or policy, a
vLLM version the adapter was not tested with, and vLLM options whose semantics the
adapter does not reproduce (async scheduling, speculative decoding, pipeline
parallelism, KV connectors, LoRA, multimodal/encoder-decoder and hybrid models).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: vLLM releases the adapter was tested with (its scheduler internals are not public).
TESTED_VLLM_VERSIONS = ("0.32.0",)
#: Policies that run inside vLLM, by andante's registry name.
POLICIES = ("andes", "fastserve", "edf", "priority", "sjf", "ascendra-lp", "ascendra-hp",
            "vllm")
DEFAULT_POLICY = "andes"
DEFAULT_LOG_INTERVAL = 10.0
CONFIG_KEY = "andante"
_KEYS = ("policy", "policy_options", "hardware", "step_log", "log_interval")


class ConfigError(ValueError):
    """A configuration andante's scheduler class refuses at startup (one line)."""


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    policy: str = DEFAULT_POLICY
    policy_options: dict[str, Any] = field(default_factory=dict)
    hardware: str | None = None
    step_log: str | None = None
    log_interval: float = DEFAULT_LOG_INTERVAL


def parse_config(additional_config: dict[str, Any] | None) -> AdapterConfig:
    """The adapter's settings from vLLM's additional_config (its "andante" object)."""
    raw = (additional_config or {}).get(CONFIG_KEY, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"additional_config.{CONFIG_KEY} must be an object, got {raw!r}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown additional_config.{CONFIG_KEY} key(s) {unknown}; "
                          f"valid: {list(_KEYS)}")
    policy = raw.get("policy", DEFAULT_POLICY)
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; andante.vllm runs: "
                          f"{', '.join(POLICIES)}")
    options = raw.get("policy_options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"policy_options must be an object, got {options!r}")
    interval = raw.get("log_interval", DEFAULT_LOG_INTERVAL)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
        raise ConfigError(f"log_interval must be a number of seconds >= 0, got {interval!r}")
    for key in ("hardware", "step_log"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{key} must be a string, got {raw[key]!r}")
    return AdapterConfig(policy=policy, policy_options=dict(options),
                         hardware=raw.get("hardware"), step_log=raw.get("step_log"),
                         log_interval=float(interval))


def check_version(version: str) -> None:
    if version not in TESTED_VLLM_VERSIONS:
        raise ConfigError(f"andante.vllm was tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)}"
                          f" only, not {version}: its scheduler internals change between "
                          "releases")


def check_vllm_config(vllm_config: Any, kv_cache_config: Any) -> None:
    """Refuse vLLM options whose behaviour the adapter does not reproduce."""
    sched, parallel = vllm_config.scheduler_config, vllm_config.parallel_config
    model = vllm_config.model_config
    refusals = [
        (sched.async_scheduling, "async scheduling is on: andante.vllm schedules one "
         "step at a time; add --no-async-scheduling"),
        (vllm_config.speculative_config is not None, "speculative decoding is not "
         "supported by andante.vllm; drop --speculative-config"),
        (parallel.pipeline_parallel_size > 1, "pipeline parallelism is not supported by "
         "andante.vllm (several batches in flight); use --pipeline-parallel-size 1"),
        (vllm_config.kv_transfer_config is not None, "KV connectors (--kv-transfer-config) "
         "are not supported by andante.vllm"),
        (vllm_config.lora_config is not None, "LoRA is not supported by andante.vllm "
         "(its policies do not enforce max_loras); drop --enable-lora"),
        (model.is_encoder_decoder or model.supports_multimodal_inputs,
         "andante.vllm schedules text-only decoder models; this model takes "
         "encoder or multimodal inputs"),
        (len(kv_cache_config.kv_cache_groups) != 1, "andante.vllm needs one KV cache "
         "group of full attention; this model has "
         f"{len(kv_cache_config.kv_cache_groups)} (hybrid or sliding-window layers)"),
    ]
    for refused, message in refusals:
        if refused:
            raise ConfigError(message)
