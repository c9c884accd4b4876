"""The Vidur comparison's tooling without Vidur installed: the profiling dataset written
from andante's cost model (Vidur's schema, values that compose back into andante's step
times, the offline HF cache layout), and the scripts' refusals when Vidur or its data
are missing."""

from __future__ import annotations

import csv
import io
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf import BatchShape, CostModel, get_hardware, get_model
from tests.benchmarks.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
VIDUR_PEER = REPO / "benchmarks" / "vidur_peer"


pt = load_script(VIDUR_PEER / "profile_tables.py", register=True)
SMALL = pt.ProfileConfig(max_tokens=512, max_num_seqs=16, kv_step=64)
COST = CostModel(get_model(SMALL.model), get_hardware(SMALL.hardware))
PARTS = pt.StepParts(COST)
LAYERS = get_model(SMALL.model).num_layers


def _rows(blob: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(lzma.decompress(blob).decode())))


@pytest.fixture(scope="module")
def dataset() -> dict[str, dict[str, bytes]]:
    return pt.build_dataset(SMALL, pt.LLAMA3_8B_SHAPE)


def test_tables_have_vidurs_schema(dataset: dict[str, dict[str, bytes]]) -> None:
    compute, network = dataset[SMALL.compute_repo], dataset[SMALL.network_repo]
    assert set(compute) == set(pt.COMPUTE_FILES) and set(network) == set(pt.NETWORK_FILES)
    config = json.loads(compute["config.json"])
    assert (config["model"], config["device_sku"]) == ("meta-llama/Llama-3-8B", "a100")
    assert json.loads(network["config.json"])["sku"] == "a100_dgx"
    mlp = _rows(compute["mlp.csv.xz"])
    assert [int(r["num_tokens"]) for r in mlp] == list(range(1, SMALL.max_tokens + 1))
    for op in (*pt.TOKEN_OPS, *pt.ZERO_OPS):
        assert f"time_stats.{op}.median" in mlp[0]
    assert {k: mlp[0][k] for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd",
                                   "vocab_size", "use_gated_mlp")} == {
        "n_head": "32", "n_kv_head": "8", "n_embd": "4096", "n_expanded_embd": "14336",
        "vocab_size": "128256", "use_gated_mlp": "True"}
    attention = _rows(compute["attention.csv.xz"])
    decode = [r for r in attention if r["is_prefill"] == "False"]
    prefill = [r for r in attention if r["is_prefill"] == "True"]
    kvs = SMALL.max_tokens // SMALL.kv_step + 1
    assert len(decode) == SMALL.max_num_seqs * kvs
    assert len(prefill) == SMALL.max_tokens // pt.PREFILL_CHUNK_STEP * kvs
    assert all(r["block_size"] == "16" and r["num_tensor_parallel_workers"] == "1"
               for r in attention)
    for name in ("all_reduce", "send_recv"):
        rows = _rows(network[f"{name}.csv.xz"])
        assert {r["collective"] for r in rows} == {name}
        assert f"time_stats.{name}.median" in rows[0]


def test_tables_compose_into_andantes_step_times(dataset: dict[str, dict[str, bytes]]) -> None:
    """num_layers x (token ops at n + attention) gives andante's step time, as Vidur adds
    them: a decode batch (kv counts the new token) and a single prefill."""
    compute = dataset[SMALL.compute_repo]
    mlp = {int(r["num_tokens"]): r for r in _rows(compute["mlp.csv.xz"])}
    attention = _rows(compute["attention.csv.xz"])

    def token_ms(n: int) -> float:
        return sum(float(mlp[n][f"time_stats.{op}.median"])
                   for op in (*pt.TOKEN_OPS, *pt.ZERO_OPS))

    def attention_ms(prefill: bool, batch: int, chunk: int, kv: int) -> float:
        column = "time_stats.attn_prefill.median" if prefill else "time_stats.attn_decode.median"
        (row,) = [r for r in attention if r["is_prefill"] == str(prefill)
                  and int(r["batch_size"]) == batch and int(r["prefill_chunk_size"]) == chunk
                  and int(r["kv_cache_size"]) == kv]
        return float(row[column])

    for batch, context in [(1, 63), (8, 255), (16, 511)]:
        vidur = LAYERS * (token_ms(batch) + attention_ms(False, batch, 0, context + 1)) / 1e3
        assert vidur == pytest.approx(COST.step_time(BatchShape.decode(batch, context)),
                                      rel=1e-9)
    for chunk in (256, 512):
        vidur = LAYERS * (token_ms(chunk) + attention_ms(True, 1, chunk, chunk)) / 1e3
        assert vidur == pytest.approx(COST.prefill_time(chunk), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 6000)), min_size=1,
                max_size=40))
def test_vidur_composition_bounds_andante_from_above(chunks: list[tuple[int, int]]) -> None:
    """Each part is its own roofline, so a step's parts sum to at least andante's time;
    and never more than one regression term per part above it."""
    andante = COST.step_time(BatchShape.of(chunks))
    vidur = PARTS.step_time(chunks)
    num_parts = 1 + any(n == 1 for n, _ in chunks) + sum(n != 1 for n, _ in chunks)
    assert andante * (1 - 1e-9) <= vidur <= andante * num_parts


@given(st.integers(1, 64), st.integers(64, 8000))
def test_decode_steps_are_exact(batch: int, context: int) -> None:
    """Exact once the KV reads outweigh the LM-head rows' FLOPs (context >= ~50): the
    decode part is then memory-bound like the token part."""
    assert PARTS.step_time([(1, context)] * batch) == pytest.approx(
        COST.step_time(BatchShape.decode(batch, context)), rel=1e-9)


def test_a_vidur_model_of_another_shape_is_refused() -> None:
    llama2 = {**pt.LLAMA3_8B_SHAPE, "name": "meta-llama/Llama-2-7b-hf", "num_kv_heads": 32,
              "mlp_hidden_dim": 11008, "vocab_size": 32768}
    with pytest.raises(ValueError, match="num_kv_heads: andante 8, Vidur 32"):
        pt.build_dataset(SMALL, llama2)
    assert pt.main(["--data", "/nonexistent", "--vidur-shape", json.dumps(llama2),
                    "--vidur-model", llama2["name"]]) == 2


def test_dataset_is_written_once_and_rewritten_when_it_changes(tmp_path: Path) -> None:
    first = pt.write_dataset(SMALL, tmp_path, pt.LLAMA3_8B_SHAPE)
    storage = pt.repo_dir(tmp_path / "cache", "compute", SMALL.compute_repo)
    snapshot = storage / "snapshots" / pt.current_snapshot(storage)
    assert first["changed"] and sorted(p.name for p in snapshot.iterdir()) == sorted(
        pt.COMPUTE_FILES)
    assert pt.dataset_problem(SMALL, tmp_path) is None
    args = (tmp_path / pt.ARGS_FILE).read_text().split("\n")
    assert args[args.index("--cache_config_num_blocks") + 1] == str(pt.kv_capacity_blocks(SMALL))
    trained = tmp_path / "cache" / "predictors" / "abc"
    trained.mkdir(parents=True)
    assert not pt.write_dataset(SMALL, tmp_path, pt.LLAMA3_8B_SHAPE)["changed"]
    assert trained.is_dir()  # same tables: Vidur's trained predictors stay
    other = pt.ProfileConfig(max_tokens=512, max_num_seqs=32, kv_step=64)
    assert "stale" in (pt.dataset_problem(other, tmp_path) or "")
    assert pt.write_dataset(other, tmp_path, pt.LLAMA3_8B_SHAPE)["changed"]
    assert not trained.exists()  # new tables: the predictors keyed by config are cleared
    assert len(list((storage / "snapshots").iterdir())) == 1


def test_missing_dataset_is_named(tmp_path: Path) -> None:
    assert "no Vidur profiling dataset" in (pt.dataset_problem(SMALL, tmp_path) or "")


def test_huggingface_hub_resolves_the_snapshot_offline(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    pt.write_dataset(SMALL, tmp_path, pt.LLAMA3_8B_SHAPE)
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(repo_id=sys.argv[1], repo_type='dataset', "
            "cache_dir=sys.argv[2]))")
    proc = subprocess.run(
        [sys.executable, "-c", code, SMALL.compute_repo,
         str(tmp_path / "cache" / "profiling_data" / "compute")],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
        check=True)
    assert (Path(proc.stdout.strip()) / "mlp.csv.xz").is_file()


def _fake_venv(peers: Path) -> None:
    python = peers / "vidur-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)


def test_run_vidur_fails_loudly_without_venv_or_data(tmp_path: Path) -> None:
    env = {**os.environ, "ANDANTE_PEERS": str(tmp_path)}
    env.pop("VIDUR_VENV", None)
    env.pop("VIDUR_DATA", None)
    script = str(VIDUR_PEER / "run_vidur.sh")
    proc = subprocess.run([script, "10"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "run_vidur: error: no Vidur venv" in proc.stderr
    _fake_venv(tmp_path)
    proc = subprocess.run([script, "10"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "no Vidur profiling dataset" in proc.stderr
    assert "setup --only vidur" in proc.stderr


def test_sim_vs_vidur_refuses_without_vidur(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script(REPO / "benchmarks" / "sim_vs_vidur.py", register=True)
    assert bench.main(["--peers", str(tmp_path), "--num-requests", "3"]) == 2
    assert "sim_vs_vidur: error: no Vidur venv" in capsys.readouterr().err
    _fake_venv(tmp_path)
    assert bench.main(["--peers", str(tmp_path), "--num-requests", "3"]) == 2
    assert "no Vidur profiling dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--policies", "vllm,no-such-policy"])


def test_trace_and_summary_helpers(tmp_path: Path) -> None:
    bench = load_script(REPO / "benchmarks" / "sim_vs_vidur.py", register=True)
    from andante.workload import RequestSpec

    trace = tmp_path / "t.csv"
    bench.write_trace([RequestSpec(0.25, 100, 7), RequestSpec(1.5, 3, 1)], trace)
    assert trace.read_text().splitlines() == [
        "Date,Time,PromptTokenCount,CompletionTokenCount",
        "2023-08-21,0.25,100,7", "2023-08-21,1.5,3,1"]
    rounds = [{"requests_per_wall_s": r, "requests_per_cpu_s": 2 * r, "mean_ttft_s": 1.0,
               "mean_e2e_s": 4.0, "loadavg_1m": [1.0, 1.0]} for r in (10.0, 30.0, 20.0)]
    med = bench.median_of(rounds)
    assert med["requests_per_wall_s"] == 20.0 and len(med["rounds"]) == 3
    fast = {**med, "requests_per_wall_s": 200.0, "requests_per_cpu_s": 80.0, "mean_e2e_s": 5.0}
    rel = bench.relative({"vidur": med, "andante/vllm": fast})
    assert rel["andante/vllm"]["requests_per_wall_s_x"] == 10.0
    assert rel["andante/vllm"]["mean_e2e_s_ratio"] == 1.25


def test_setup_offers_the_vidur_part() -> None:
    proc = subprocess.run([str(REPO / "benchmarks" / "peers" / "setup"), "--help"],
                          capture_output=True, text=True, check=True)
    assert "vidur-venv" in proc.stdout and "vidur-data" in proc.stdout
