"""`andante serve`: the OpenAI-compatible server on the embedded model (or another)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from andante.cli.batch import add_queue_args, batch_options_from_args
from andante.cli.options import (
    add_prefix_caching_arg,
    block_size,
    parse_key_values,
    positive_float,
    positive_int,
)
from andante.core.request import PreemptionMode
from andante.policies import policy_names
from andante.runtime.durable.store import default_state_dir


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve the embedded default model (SmolLM2-135M-Instruct, CPU) or "
        "--model PATH over /v1/completions and /v1/chat/completions, with SSE streaming, "
        "per-request SLOs, /metrics and a live page at /.",
    )
    p.add_argument("--model", action="append", metavar="PATH | NAME=PATH",
                   help="model path; default: the embedded model; 'toy': a byte-level fake "
                   "model without weights (tests, demos). Repeat as NAME=PATH to serve "
                   "several models (NAME= alone: the embedded model) with model swaps")
    p.add_argument("--host-memory-gib", type=float,
                   help="several models: cap on the host memory for warm weight copies "
                   "(default: every model stays warm)")
    p.add_argument("--served-model-name", help="name in /v1/models (default: from the model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every path "
                   "but /health (the live page, /metrics, /api/stats too, unless "
                   "--public-metrics; default: $ANDANTE_API_KEY)")
    p.add_argument("--api-keys-file", metavar="PATH",
                   help="several tenants: 'NAME KEY' per line; each key sees only the "
                   "files and batches made with it (--api-key alone: one tenant, every "
                   "caller sees everything)")
    p.add_argument("--policy", default="", help=f"one of {', '.join(policy_names())} "
                   "(default vllm; --router qlm runs qlm-edf and refuses another)")
    p.add_argument("--policy-option", action="append", metavar="KEY=VALUE")
    p.add_argument("--max-queued", type=positive_int, default=256,
                   help="requests waiting for their first token beyond which new ones get "
                   "429 (default 256)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    _add_http_args(p)
    _add_engine_args(p)
    _add_cluster_args(p)
    add_queue_args(p, state_dir_default=str(default_state_dir()))
    p.set_defaults(run=run)


def _add_http_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP limits")
    g.add_argument("--max-body-bytes", type=positive_int, default=4 << 20,
                   help="largest request body; larger ones get 413 (default 4 MiB)")
    g.add_argument("--header-timeout", type=positive_float, default=10.0,
                   help="seconds a client may take to send its request headers (408)")
    g.add_argument("--body-timeout", type=positive_float, default=30.0,
                   help="seconds a client may take to send its request body after its "
                   "headers (408; one timer from the request's first byte)")
    g.add_argument("--upload-timeout", type=positive_float, default=300.0,
                   help="the same for an upload to /v1/files (default 300)")
    g.add_argument("--max-uploads", type=positive_int, default=2,
                   help="uploads to /v1/files received at once; more get 429 (default 2)")
    g.add_argument("--public-metrics", action="store_true",
                   help="with --api-key, leave /, /metrics, /api/stats and /openapi.json "
                   "open (/health always is)")


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (the instances behind the controller)")
    g.add_argument("--instances", type=positive_int, default=1,
                   help="engine instances (default 1: a cluster of one)")
    g.add_argument("--backend", choices=["auto", "inprocess", "process", "ray"],
                   default="auto",
                   help="instances as engine processes (one child process each: the engine "
                   "off the HTTP server's interpreter lock), as threads of this process, or "
                   "Ray actors (default auto: process for one real model, inprocess for "
                   "--model toy, several models and --router kunserve)")
    g.add_argument("--router",
                   help="round-robin (the default), least-loaded (the default with "
                   "--upstream), power-of-two, qlm or ascendra (LP and HP pools; "
                   "--policy-option lp.KEY=V / hp.KEY=V)")
    g.add_argument("--router-option", action="append", metavar="KEY=VALUE")
    g.add_argument("--hp-instances", type=positive_int, default=1,
                   help="router ascendra: instances in the HP pool (default 1)")
    g.add_argument("--ray-address", default="local",
                   help="'local' (embedded Ray), 'auto' or ray://HOST:PORT to join a cluster")
    g.add_argument("--max-restarts", type=int, default=3,
                   help="Ray actor restarts per instance (default 3)")
    _add_fleet_args(p)


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleet (andante in front of OpenAI-compatible servers)")
    g.add_argument("--upstream", action="append", metavar="URL",
                   help="an OpenAI-compatible server (vLLM, SGLang, llama.cpp, andante) as "
                   "an instance of the cluster; repeat for several. Then no model is "
                   "loaded here: --router places each request on an upstream serving its "
                   "model (default least-loaded)")
    g.add_argument("--fleet", metavar="FILE",
                   help="the upstreams as a TOML file: the format of simulate --cluster, "
                   "each [[instances]] with a url (and optionally role, max_num_seqs)")
    g.add_argument("--poll-interval", type=positive_float,
                   help="seconds between reads of each upstream's /metrics (default 0.5)")
    g.add_argument("--probe-timeout", type=positive_float, default=2.0,
                   help="seconds an upstream may take to answer a probe (default 2); two "
                   "failed probes in a row, or a refused connection, mark it down")
    g.add_argument("--retry-window", type=positive_float, default=60.0,
                   help="seconds a request without an SLO deadline may be retried on other "
                   "upstreams after a 429, 5xx or lost connection (default 60)")
    g.add_argument("--offload-at", type=positive_float, default=0.5,
                   help="router ascendra: share of a request's TTFT target after which an "
                   "LP upstream's request without a token moves to the HP pool (default 0.5)")
    g.add_argument("--upstream-max-num-seqs", type=positive_int, default=64,
                   help="each --upstream's batch capacity, as routers read it (default 64)")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=positive_int, default=64)
    g.add_argument("--max-num-batched-tokens", type=positive_int)
    g.add_argument("--max-model-len", type=positive_int, help="default: the model's context")
    g.add_argument("--block-size", type=block_size, default=16,
                   help="KV block tokens: 1, 8, 16, 32, 64, 128 or 256 (vLLM's sizes)")
    g.add_argument("--num-kv-blocks", type=positive_int, help="KV-cache size in blocks "
                   "(overrides --kv-cache-gib)")
    g.add_argument("--kv-cache-gib", type=positive_float,
                   help="KV-cache memory (default: enough for --max-num-seqs full contexts, "
                   "at most 5%% of the available memory; the startup log says how much)")
    g.add_argument("--swap-space", type=float, default=0.25,
                   help="host KV GiB for swapping (default 0.25)")
    g.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                   help="weights and KV (default auto: measured once per machine and "
                   "model, on a quiet machine: bfloat16 where it is at least 1.1x faster "
                   "than float32 and its greedy answers to a set of prompts agree with "
                   "float32's (>= 0.6 of the tokens), else float32; cached under the "
                   "andante home)")
    g.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    add_prefix_caching_arg(g)
    g.add_argument("--threads", type=positive_int, help="torch threads (default: all cores)")
    g.add_argument("--trace-steps", metavar="FILE",
                   help="debugging: write every engine step and every finished request's "
                   "timings (arrival, taken in by the engine, first scheduled, first token, "
                   "prefill steps) to FILE as JSON lines (instance i > 0: FILE.i)")
    g.add_argument("--toy-step-ms", type=positive_float, default=5.0,
                   help="step time of the toy model (ms)")
    g.add_argument("--dev-mode", action="store_true",
                   help="vLLM's dev-mode sleep endpoints: POST /sleep?level=1|2, POST "
                   "/wake_up, GET /is_sleeping (a fleet swaps models sharing a device with "
                   "them; also $ANDANTE_SERVER_DEV_MODE=1); needs --backend inprocess")


def options_from_args(args: argparse.Namespace) -> Any:
    from andante.server.config import (
        EngineOptions,
        HTTPLimits,
        ServeOptions,
        env_defaults,
        read_keys_file,
    )

    engine = EngineOptions(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        preemption_mode=PreemptionMode[args.preemption_mode.upper()],
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_gib=args.kv_cache_gib,
        swap_space_gib=args.swap_space,
        dtype=_dtype(args),
        num_threads=args.threads,
        toy_step_time=args.toy_step_ms / 1000.0,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    model, models = parse_models(args.model)
    return ServeOptions(
        model=model,
        models=models,
        host_memory_gib=args.host_memory_gib,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        api_key=None if args.api_keys_file else args.api_key or env_defaults()["api_key"],
        api_keys=read_keys_file(args.api_keys_file) if args.api_keys_file else (),
        policy=args.policy,
        policy_options=parse_key_values(args.policy_option),
        max_queued=args.max_queued,
        engine=engine,
        log_level=args.log_level,
        instances=args.instances,
        backend=resolve_backend(args.backend, model, models, args.router or "round-robin"),
        router=args.router or "round-robin",
        router_options=parse_key_values(args.router_option),
        hp_instances=args.hp_instances,
        ray_address=args.ray_address,
        max_restarts=args.max_restarts,
        limits=HTTPLimits(max_body_bytes=args.max_body_bytes, header_timeout=args.header_timeout,
                          body_timeout=args.body_timeout, public_metrics=args.public_metrics,
                          max_file_bytes=args.max_file_bytes,
                          upload_timeout=args.upload_timeout, max_uploads=args.max_uploads),
        batch=batch_options_from_args(args),
        trace_steps=args.trace_steps,
        dev_mode=args.dev_mode or env_defaults()["dev_mode"] == "1",
    )


def resolve_backend(backend: str, model: str | None, models: tuple[Any, ...],
                    router: str) -> str:
    """`--backend auto`: an engine process for one real model (measured faster under
    load: benchmarks/serve_vs_vllm.py), threads where the instances must share this
    process (several models swapping on one device, KunServe's pipeline groups) or
    where there is no engine worth moving (the toy model)."""
    if backend != "auto":
        return backend
    from andante.cluster.registry import router_entry
    from andante.server.config import TOY_MODEL

    if models or model == TOY_MODEL or router_entry(router).in_process:
        return "inprocess"
    return "process"


def parse_models(items: list[str] | None
                 ) -> tuple[str | None, tuple[tuple[str, str | None], ...]]:
    """--model values -> (one model's path, or the named models): a bare PATH once, or
    NAME=PATH each time (an empty PATH: the embedded model)."""
    if not items:
        return None, ()
    named = [item for item in items if "=" in item]
    if not named:
        if len(items) > 1:
            raise ValueError(f"--model: give several models as NAME=PATH, got {items}")
        return items[0], ()
    if len(named) != len(items):
        raise ValueError(f"--model: every model needs a NAME= once several are named, got "
                         f"{items}")
    models = tuple((name, path or None) for name, _, path in
                   (item.partition("=") for item in items))
    return None, models


def fleet_options_from_args(args: argparse.Namespace) -> Any:
    from andante.cluster.registry import router_entry
    from andante.runtime.upstream.discovery import UpstreamSpec, base_url, load_fleet_file
    from andante.runtime.upstream.fleet import FleetOptions
    from andante.server.config import HTTPLimits, env_defaults
    from andante.server.fleet_app import FleetServeOptions

    if args.api_keys_file:
        raise ValueError("--api-keys-file is for an engine server; in front of upstreams "
                         "give one --api-key (the fleet is single-tenant)")
    specs = [UpstreamSpec(base_url(url), max_num_seqs=args.upstream_max_num_seqs)
             for url in args.upstream or ()]
    router, router_options, poll = None, parse_key_values(args.router_option), None
    if args.fleet:
        from pathlib import Path

        file = load_fleet_file(Path(args.fleet))
        specs += file.upstreams
        router, poll = file.router, file.poll_interval
        router_options = {**file.router_options, **router_options}
    router = args.router or router or "least-loaded"
    if router_entry(router).reads_prompt_tokens:
        raise ValueError(f"--router {router} matches prompt token blocks, which a fleet "
                         "in front of upstreams (text in, text out) does not have; use "
                         "least-loaded, power-of-two, round-robin, ascendra or qlm")
    specs = _ascendra_roles(specs, router, args.hp_instances)
    fleet = FleetOptions(router=router, router_options=router_options,
                         poll_interval=args.poll_interval or poll or 0.5,
                         probe_timeout=args.probe_timeout, retry_window_s=args.retry_window,
                         offload_at=args.offload_at)
    return FleetServeOptions(
        upstreams=tuple(specs), fleet=fleet, host=args.host, port=args.port,
        api_key=args.api_key or env_defaults()["api_key"], log_level=args.log_level,
        limits=HTTPLimits(max_body_bytes=args.max_body_bytes, header_timeout=args.header_timeout,
                          body_timeout=args.body_timeout, public_metrics=args.public_metrics,
                          max_file_bytes=args.max_file_bytes),
        batch=batch_options_from_args(args))


def _ascendra_roles(specs: list[Any], router: str, num_hp: int) -> list[Any]:
    """A pool router without roles in the fleet: its pool plan names them (ascendra:
    the last --hp-instances upstreams are HP)."""
    import dataclasses

    from andante.cluster.registry import router_entry

    pool_plan = router_entry(router).hook("pool_plan")
    if pool_plan is None or any(s.role for s in specs):
        return specs
    plan = pool_plan(len(specs), num_hp)
    return [dataclasses.replace(s, role=m.role) for s, m in zip(specs, plan, strict=True)]


def run_fleet(args: argparse.Namespace) -> int:
    from andante.runtime.upstream.discovery import FleetError
    from andante.server.fleet_launch import serve_fleet
    from andante.server.listen import PortUnavailable

    try:
        return serve_fleet(fleet_options_from_args(args))
    except (FleetError, PortUnavailable, ValueError) as exc:
        print(f"andante serve: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    if args.upstream or args.fleet:  # the fleet front imports neither engine nor torch
        return run_fleet(args)
    from andante.server.launch import PortUnavailable, serve  # the web stack is an extra

    try:
        return serve(options_from_args(args))
    except PortUnavailable as exc:
        print(f"andante serve: {exc}", file=sys.stderr)
        return 1


def _dtype(args: argparse.Namespace) -> str:
    """`--dtype auto`: for one model, the dtype measured on this machine (speed and
    greedy agreement with float32, cached: andante.exec.torch_dtype); for several, bfloat16
    where oneDNN has bf16 GEMMs on this CPU, else float32 (the toy engine loads no
    weights)."""
    if args.dtype != "auto":
        return str(args.dtype)
    if args.model and all(m.split("=", 1)[-1] == "toy" for m in args.model):
        return "float32"
    from andante.exec.torch_layers import preferred_dtype

    path = args.model[0] if args.model and len(args.model) == 1 else None
    if args.model is None or (path is not None and "=" not in path and Path(path).exists()):
        from andante.exec.torch_dtype import serving_dtype

        try:
            choice = serving_dtype(path)
        except (ValueError, RuntimeError, OSError) as exc:  # the load reports it later
            print(f"andante serve: dtype not measured ({exc})", file=sys.stderr)
            return preferred_dtype()
        print(f"andante serve: {choice.describe()}", file=sys.stderr, flush=True)
        return choice.dtype

    return preferred_dtype()
