"""Vidur's profiling dataset written from andante's cost model, so that Vidur and andante
simulate the same model with the same step costs (run by `benchmarks/peers/setup`).

Design note. Vidur (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM
Inference", MLSys 2024, §4) times a step as num_layers x the sum of per-layer operator
times, each learned (random forests) from profiled rows: the token-level operators
(QKV and output projections, MLP up/down, activation, norms, add, RoPE, KV save) by the
batch's token count n; decode attention by (decode batch size b, mean KV length kv);
prefill attention per request by (KV length kv including the chunk, chunk size q).
andante's cost model (Ascendra §5.1, `andante.perf.cost_model`) combines the step's
memory time tM and compute time tF as t = c1(tM+tF) + c2 max(tM,tF) + c3 tM + c4 tF + c5.
This writer splits andante's terms along Vidur's axes, each part combined by the same
regression on its own (tM, tF) and divided by num_layers:

  token part T(n)      weights (LM head included), activations and KV writes of n
                       tokens, dense FLOPs, plus the fixed c5; split over the four
                       projections by their share of the weights;
  decode D(b, kv)      b sequences reading kv tokens of KV each, one LM-head row each;
  prefill P(kv, q)     one chunk of q tokens after kv - q cached ones, one LM-head row.

A step whose parts are all memory-bound (decode past ~50 tokens of context) or all
compute-bound (long prefill) gets andante's step time exactly; otherwise the sum of the
parts' maxima is a little above andante's single maximum (+1.5% for 800 prefill tokens
with 20 decodes, +3% for 256 decodes at 4k context). The other operators (activation,
norms, add, RoPE, KV save) are 0: andante counts them inside the token part. Network
tables (all-reduce, send/recv) come from the hardware's interconnect; Vidur reads them
only for TP > 1 or PP > 1.

The dataset goes into an HF-hub-style cache (`datasets--offline--<name>/refs/main ->
snapshots/<sha>`), which Vidur's `snapshot_download` resolves with HF_HUB_OFFLINE=1,
and `vidur_args.txt` (next to it) lists the Vidur flags that select it and match
andante's engine settings. Rewritten only when the tables change; then Vidur's trained
predictors, keyed by configuration and not by data, are cleared.

Usage: profile_tables.py --data DIR [--vidur-shape JSON] [options]   (see --help)
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import lzma
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from andante.perf import BatchShape, CostModel, get_hardware, get_model
from andante.perf.specs import ModelSpec

TOKEN_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ZERO_OPS = ("mlp_act", "input_layernorm", "post_attention_layernorm", "attn_rope", "add")
PREFILL_CHUNK_STEP = 32  # Vidur predicts prefill attention for chunks 32, 64, ...
COMPUTE_FILES = ("config.json", "mlp.csv.xz", "attention.csv.xz")
NETWORK_FILES = ("config.json", "all_reduce.csv.xz", "send_recv.csv.xz")
STALE_CACHES = ("predictors", "predictions", "training_predictions", "hf_predictions")
ARGS_FILE = "vidur_args.txt"
PREDICTOR = "random_forrest_execution_time_predictor_config"
MS = 1e3
# vidur 0.0.26's meta-llama/Llama-3-8B (vidur/config/model_config.py), the default
# target; setup passes the installed Vidur's own figures with --vidur-shape.
LLAMA3_8B_SHAPE = {"name": "meta-llama/Llama-3-8B", "num_layers": 32, "num_q_heads": 32,
                   "num_kv_heads": 8, "embedding_dim": 4096, "mlp_hidden_dim": 14336,
                   "vocab_size": 128256, "use_gated_mlp": True}


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """What to profile and the engine settings both simulators get.

    max_tokens bounds a request (prompt + output), a step's tokens and a prefill chunk;
    max_num_seqs is the batch cap; kv_step is Vidur's KV-length granularity.
    """

    model: str = "llama-3.1-8b"
    hardware: str = "a100-80g"
    vidur_model: str = "meta-llama/Llama-3-8B"
    device: str = "a100"
    network_device: str = "a100_dgx"
    max_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    kv_step: int = 64
    watermark: float = 0.01
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_num_seqs", "block_size", "kv_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens % PREFILL_CHUNK_STEP or self.max_tokens % self.kv_step:
            raise ValueError(f"max_tokens={self.max_tokens} must be a multiple of "
                             f"{PREFILL_CHUNK_STEP} and of kv_step={self.kv_step}")

    @property
    def compute_repo(self) -> str:
        return f"offline/andante-{self.model}-{self.hardware}"

    @property
    def network_repo(self) -> str:
        return f"offline/andante-{self.hardware}-network"


def check_shape(model: ModelSpec, vidur_shape: dict[str, Any]) -> None:
    """Refuse a Vidur model whose shape differs from andante's (then the two would not
    simulate the same model)."""
    ours = {"num_layers": model.num_layers, "num_q_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads, "embedding_dim": model.hidden_size,
            "mlp_hidden_dim": model.intermediate_size, "vocab_size": model.vocab_size,
            "use_gated_mlp": model.mlp_kind == "gated"}
    if model.head_dim * model.num_heads != model.hidden_size:
        raise ValueError(f"{model.name}: head_dim x heads != hidden size; Vidur cannot "
                         "describe it")
    diff = [f"{k}: andante {v}, Vidur {vidur_shape.get(k)}" for k, v in ours.items()
            if vidur_shape.get(k) != v]
    if diff:
        raise ValueError(f"Vidur's {vidur_shape.get('name')} is not andante's {model.name}: "
                         + "; ".join(diff))


class StepParts:
    """andante's step time split into Vidur's parts (seconds, whole model)."""

    def __init__(self, cost: CostModel) -> None:
        self._init_terms(cost)
        self._init_regression(cost)

    def _init_terms(self, cost: CostModel) -> None:
        def terms(n: int, s: int, pairs: float, kv: int) -> tuple[float, float]:
            return cost.terms(BatchShape(num_seqs=max(s, 1), num_tokens=n, num_sampled=s,
                                         attn_pairs=pairs, kv_tokens_read=kv))

        def minus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
            return (a[0] - b[0], a[1] - b[1])

        # terms() is affine in each count: unit costs are differences of two shapes.
        base = terms(1, 0, 0.0, 0)
        self._per_token = minus(terms(2, 0, 0.0, 0), base)
        self._per_sample = minus(terms(1, 2, 0.0, 0), terms(1, 1, 0.0, 0))
        self._per_pair = minus(terms(1, 0, 1.0, 0), base)
        self._per_kv = minus(terms(1, 0, 0.0, 1), base)
        # Weights and LM-head weights (paid once per step) without any token or sample.
        once = minus(terms(1, 1, 0.0, 0), self._per_sample)
        self._fixed = minus(once, self._per_token)
        self.num_layers = cost.model.num_layers

    def _init_regression(self, cost: CostModel) -> None:
        self._c_sum, self._c_max, self._c_mem, self._c_flop, self._c_fixed = \
            cost.coefficients.as_tuple()

    def _time(self, mem: float, flop: float) -> float:
        return (self._c_sum * (mem + flop) + self._c_max * max(mem, flop)
                + self._c_mem * mem + self._c_flop * flop)

    def token_part(self, num_tokens: int) -> float:
        mem = self._fixed[0] + self._per_token[0] * num_tokens
        flop = self._fixed[1] + self._per_token[1] * num_tokens
        return self._time(mem, flop) + self._c_fixed

    def decode_part(self, batch_size: int, kv: int) -> float:
        """b decodes attending to kv tokens each (the new one included)."""
        reads = batch_size * kv
        mem = self._per_kv[0] * reads + self._per_pair[0] * reads + self._per_sample[0] * batch_size
        flop = (self._per_kv[1] * reads + self._per_pair[1] * reads
                + self._per_sample[1] * batch_size)
        return self._time(mem, flop)

    def prefill_part(self, kv: int, chunk: int) -> float:
        """One chunk of `chunk` tokens whose KV ends at `kv` tokens (chunk included)."""
        cached = max(kv - chunk, 0)
        pairs = cached * chunk + (chunk * chunk + chunk) * 0.5
        reads = cached + chunk
        mem = self._per_kv[0] * reads + self._per_pair[0] * pairs + self._per_sample[0]
        flop = self._per_kv[1] * reads + self._per_pair[1] * pairs + self._per_sample[1]
        return self._time(mem, flop)

    def step_time(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Vidur's composition for a step of (new tokens, cached tokens) per request."""
        decodes = [cached + 1 for new, cached in chunks if new == 1]
        total = self.token_part(sum(new for new, _ in chunks))
        if decodes:
            total += self.decode_part(len(decodes), round(sum(decodes) / len(decodes)))
        return total + sum(self.prefill_part(cached + new, new)
                           for new, cached in chunks if new != 1)


def _token_shares(model: ModelSpec) -> dict[str, float]:
    h, q, kv, i = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    weights = {"attn_pre_proj": h * (q + 2 * kv), "attn_post_proj": q * h,
               "mlp_up_proj": (2 if model.mlp_kind == "gated" else 1) * h * i,
               "mlp_down_proj": i * h}
    total = sum(weights.values())
    return {op: w / total for op, w in weights.items()}


def mlp_rows(cfg: ProfileConfig, parts: StepParts, model: ModelSpec) -> list[dict[str, Any]]:
    shares = _token_shares(model)
    shape = {"n_head": model.num_heads, "n_kv_head": model.num_kv_heads,
             "n_embd": model.hidden_size, "n_expanded_embd": model.intermediate_size,
             "vocab_size": model.vocab_size, "use_gated_mlp": model.mlp_kind == "gated",
             "num_tensor_parallel_workers": 1}
    rows = []
    for n in range(1, cfg.max_tokens + 1):
        per_layer = parts.token_part(n) * MS / parts.num_layers
        row: dict[str, Any] = {"num_tokens": n}
        row.update({f"time_stats.{op}.median": per_layer * shares[op] for op in TOKEN_OPS})
        row.update({f"time_stats.{op}.median": 0.0 for op in ZERO_OPS})
        rows.append({**row, **shape})
    return rows


def attention_rows(cfg: ProfileConfig, parts: StepParts,
                   model: ModelSpec) -> list[dict[str, Any]]:
    shape = {"n_embd": model.hidden_size, "n_q_head": model.num_heads,
             "n_kv_head": model.num_kv_heads, "block_size": cfg.block_size,
             "num_tensor_parallel_workers": 1, "max_model_len": cfg.max_tokens,
             "time_stats.attn_kv_cache_save.median": 0.0}
    kvs = range(0, cfg.max_tokens + 1, cfg.kv_step)
    scale = MS / parts.num_layers
    rows = [{"batch_size": b, "prefill_chunk_size": 0, "kv_cache_size": kv,
             "is_prefill": False, "time_stats.attn_decode.median": parts.decode_part(b, kv) * scale,
             "time_stats.attn_prefill.median": "", **shape}
            for b in range(1, cfg.max_num_seqs + 1) for kv in kvs]
    rows += [{"batch_size": 1, "prefill_chunk_size": q, "kv_cache_size": kv,
              "is_prefill": True, "time_stats.attn_decode.median": "",
              "time_stats.attn_prefill.median": parts.prefill_part(kv, q) * scale, **shape}
             for q in range(PREFILL_CHUNK_STEP, cfg.max_tokens + 1, PREFILL_CHUNK_STEP)
             for kv in kvs]
    return rows


def network_rows(cfg: ProfileConfig, collective: str) -> list[dict[str, Any]]:
    """All-reduce (ring) or send/recv times from the hardware's interconnect, for 2, 4
    and 8 workers on one node (devices_per_node = workers) and across nodes (1)."""
    hw = get_hardware(cfg.hardware)
    rows = []
    for workers in (2, 4, 8):
        for per_node in sorted({workers, 2, 1}):
            for size in (2 ** k for k in range(10, 31)):
                factor = 2.0 * (workers - 1) / workers if collective == "all_reduce" else 1.0
                seconds = hw.collective_latency + factor * size / hw.interconnect_bandwidth
                rows.append({"size": size, "num_workers": workers,
                             "devices_per_node": per_node, "collective": collective,
                             f"time_stats.{collective}.median": seconds * MS})
    return rows


def csv_xz(rows: Iterable[dict[str, Any]]) -> bytes:
    """Rows as an xz-compressed CSV (floats with repr's full precision)."""
    rows = list(rows)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return lzma.compress(text.getvalue().encode(), preset=6)


def kv_capacity_blocks(cfg: ProfileConfig) -> int:
    cost = CostModel(get_model(cfg.model), get_hardware(cfg.hardware))
    return cost.kv_capacity_tokens(cfg.gpu_memory_utilization) // cfg.block_size


def build_dataset(cfg: ProfileConfig, vidur_shape: dict[str, Any]
                  ) -> dict[str, dict[str, bytes]]:
    """{repo id: {file name: content}} of the compute and network datasets."""
    model = get_model(cfg.model)
    check_shape(model, vidur_shape)
    cost = CostModel(model, get_hardware(cfg.hardware))
    parts = StepParts(cost)
    tables = {"mlp.csv.xz": csv_xz(mlp_rows(cfg, parts, model)),
              "attention.csv.xz": csv_xz(attention_rows(cfg, parts, model))}
    network = {f"{c}.csv.xz": csv_xz(network_rows(cfg, c)) for c in ("all_reduce", "send_recv")}
    compute_config = {"model": cfg.vidur_model, "device_sku": cfg.device,
                      "vidur_shape": vidur_shape,
                      "written_by": "andante benchmarks/vidur_peer/profile_tables.py",
                      "andante": {**asdict(cfg), "coefficients": cost.coefficients.as_tuple(),
                                  "kv_capacity_blocks": kv_capacity_blocks(cfg)}}
    network_config = {"sku": cfg.network_device, "andante_hardware": cfg.hardware}
    return {
        cfg.compute_repo: {"config.json": _json_bytes(compute_config), **tables},
        cfg.network_repo: {"config.json": _json_bytes(network_config), **network},
    }


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def fingerprint(files: dict[str, bytes]) -> str:
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def repo_dir(cache: Path, kind: str, repo_id: str) -> Path:
    """Where huggingface_hub keeps `repo_id` under Vidur's cache_dir for `kind`."""
    return cache / "profiling_data" / kind / ("datasets--" + repo_id.replace("/", "--"))


def current_snapshot(storage: Path) -> str | None:
    ref = storage / "refs" / "main"
    if not ref.is_file():
        return None
    sha = ref.read_text(encoding="utf-8").strip()
    return sha if (storage / "snapshots" / sha).is_dir() else None


def write_snapshot(storage: Path, files: dict[str, bytes]) -> bool:
    """Make `files` the snapshot refs/main points at; False when it already was."""
    sha = fingerprint(files)
    if current_snapshot(storage) == sha:
        return False
    partial = storage / "snapshots" / f"{sha}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, content in files.items():
        (partial / name).write_bytes(content)
    shutil.rmtree(storage / "snapshots" / sha, ignore_errors=True)
    partial.rename(storage / "snapshots" / sha)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(sha, encoding="utf-8")
    for old in (storage / "snapshots").iterdir():
        if old.name != sha:
            shutil.rmtree(old)
    return True


def vidur_args(cfg: ProfileConfig, cache: Path) -> list[str]:
    """The Vidur flags that select this dataset and match andante's engine settings."""
    p = PREDICTOR
    return [
        "--replica_config_model_name", cfg.vidur_model,
        "--replica_config_device", cfg.device,
        "--replica_config_network_device", cfg.network_device,
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "vllm",
        "--vllm_scheduler_config_batch_size_cap", str(cfg.max_num_seqs),
        "--vllm_scheduler_config_max_tokens_in_batch", str(cfg.max_tokens),
        "--trace_request_generator_config_max_tokens", str(cfg.max_tokens),
        "--trace_request_length_generator_config_max_tokens", str(cfg.max_tokens),
        "--synthetic_request_generator_config_max_tokens", str(cfg.max_tokens),
        "--cache_config_block_size", str(cfg.block_size),
        "--cache_config_num_blocks", str(kv_capacity_blocks(cfg)),
        "--cache_config_watermark_blocks_fraction", str(cfg.watermark),
        "--execution_time_predictor_config_type", "random_forrest",
        f"--{p}_model_profiling_dataset", cfg.compute_repo,
        f"--{p}_network_profiling_dataset", cfg.network_repo,
        f"--{p}_cache_dir", str(cache),
        f"--{p}_prediction_max_tokens_per_request", str(cfg.max_tokens),
        f"--{p}_prediction_max_batch_size", str(cfg.max_num_seqs),
        f"--{p}_prediction_max_prefill_chunk_size", str(cfg.max_tokens),
        f"--{p}_kv_cache_prediction_granularity", str(cfg.kv_step),
        f"--{p}_attention_decode_batching_overhead_fraction", "0",
    ]


def write_dataset(cfg: ProfileConfig, data: Path, vidur_shape: dict[str, Any]) -> dict[str, Any]:
    """Write the datasets and vidur_args.txt under `data`; clear Vidur's predictor caches
    when a table changed. Returns a summary."""
    cache = data / "cache"
    dataset = build_dataset(cfg, vidur_shape)
    changed = False
    for (repo, files), kind in zip(dataset.items(), ("compute", "network"), strict=True):
        changed |= write_snapshot(repo_dir(cache, kind, repo), files)
    if changed:
        for stale in STALE_CACHES:
            shutil.rmtree(cache / stale, ignore_errors=True)
    (data / ARGS_FILE).write_text("\n".join(vidur_args(cfg, cache)) + "\n", encoding="utf-8")
    return {"changed": changed, "cache": str(cache), "args": str(data / ARGS_FILE),
            "compute": cfg.compute_repo, "network": cfg.network_repo,
            "fingerprint": fingerprint(dataset[cfg.compute_repo])}


def dataset_problem(cfg: ProfileConfig, data: Path) -> str | None:
    """Why the dataset under `data` cannot be used for `cfg` (missing or stale), or None."""
    storage = repo_dir(data / "cache", "compute", cfg.compute_repo)
    sha = current_snapshot(storage)
    if sha is None or not (data / ARGS_FILE).is_file():
        return f"no Vidur profiling dataset for {cfg.model} on {cfg.hardware} under {data}"
    stored = json.loads((storage / "snapshots" / sha / "config.json").read_text("utf-8"))
    try:
        expected = build_dataset(cfg, stored.get("vidur_shape", {}))[cfg.compute_repo]
    except ValueError as exc:
        return f"the Vidur profiling dataset under {data} does not fit: {exc}"
    if fingerprint(expected) != sha:
        return (f"the Vidur profiling dataset under {data} is stale (andante's cost model or "
                "settings changed since it was written)")
    return None


def parse_args(argv: Sequence[str] | None) -> tuple[ProfileConfig, Path, dict[str, Any]]:
    defaults = ProfileConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True,
                        help="output folder ($ANDANTE_PEERS/vidur-data): cache/ and "
                             f"{ARGS_FILE} are written there")
    parser.add_argument("--vidur-shape", default=None,
                        help="JSON of the Vidur model's shape (vidur_shape.py prints it); "
                             "default: vidur 0.0.26's meta-llama/Llama-3-8B")
    for name in ("model", "hardware", "vidur_model", "device", "network_device"):
        parser.add_argument(f"--{name.replace('_', '-')}", default=getattr(defaults, name))
    for name in ("max_tokens", "max_num_seqs", "block_size", "kv_step"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int,
                            default=getattr(defaults, name))
    args = parser.parse_args(argv)
    shape = LLAMA3_8B_SHAPE if args.vidur_shape is None else json.loads(args.vidur_shape)
    cfg = ProfileConfig(model=args.model, hardware=args.hardware, vidur_model=args.vidur_model,
                        device=args.device, network_device=args.network_device,
                        max_tokens=args.max_tokens, max_num_seqs=args.max_num_seqs,
                        block_size=args.block_size, kv_step=args.kv_step)
    if shape.get("name") != cfg.vidur_model:
        parser.error(f"--vidur-shape describes {shape.get('name')!r}, not {cfg.vidur_model!r}")
    return cfg, args.data, shape


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg, data, shape = parse_args(argv)
        summary = write_dataset(cfg, data, shape)
    except ValueError as exc:
        print(f"profile_tables: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
