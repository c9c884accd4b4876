"""`andante bench` against a live toy server: vllm-bench metrics, QoE, goodput, JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from andante.bench.load import BenchConfig, run_bench
from andante.bench.prompts import PromptFormat, synthesize
from andante.cli.main import main
from andante.core import SLO
from andante.server import ServerThread
from andante.workload import RequestSpec
from tests.server.helpers import toy_server

TOY_IDS = PromptFormat("tokens", 65, 91)  # byte ids of A-Z: valid in the toy vocabulary


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with toy_server(toy_step_time=0.003) as srv:
        yield srv


def test_prompt_formats() -> None:
    rng = np.random.default_rng(0)
    ids = synthesize(PromptFormat.parse("tokens:5:9"), 50, rng)
    assert isinstance(ids, list) and len(ids) == 50 and set(ids) <= set(range(5, 9))
    text = synthesize(PromptFormat.parse("text"), 30, rng)
    assert isinstance(text, str) and len(text.split()) == 30
    with pytest.raises(ValueError):
        PromptFormat.parse("tokens:9:5")
    with pytest.raises(ValueError):
        PromptFormat.parse("words")


def test_run_bench_measures_every_request(server: ServerThread) -> None:
    specs = [RequestSpec(0.02 * i, 16 + i, 8 + i, SLO(ttft=1.0, tds=5.0)) for i in range(12)]
    cfg = BenchConfig(base_url=server.url, prompt_format=TOY_IDS,
                      goodput={"ttft": 1.0, "tpot": 0.5})
    run = asyncio.run(run_bench(specs, cfg))
    s = run.summary
    assert run.model == "toy" and not run.errors
    assert (s.num_requests, s.num_finished, s.num_aborted) == (12, 12, 0)
    assert s.total_output_tokens == sum(8 + i for i in range(12))
    assert s.total_input_tokens == sum(16 + i for i in range(12))
    assert 0 < s.ttft.median < 1.0 and s.tpot.mean > 0 and s.itl.count > 0
    assert s.num_good == 12 and s.qoe.mean == 1.0 and s.slo_attainment == 1.0
    arrivals = [r.arrival_time for r in run.records]
    assert arrivals == sorted(arrivals) and arrivals[-1] >= 0.2


def test_rejected_requests_are_counted(server: ServerThread) -> None:
    specs = [RequestSpec(0.0, 5000, 4), RequestSpec(0.0, 10, 4)]  # the first is over context
    run = asyncio.run(run_bench(specs, BenchConfig(base_url=server.url, prompt_format=TOY_IDS)))
    assert run.summary.num_finished == 1 and run.summary.num_aborted == 1
    assert run.errors and "400" in run.errors[0]


def test_chat_endpoint_with_text_prompts(server: ServerThread) -> None:
    cfg = BenchConfig(base_url=server.url, endpoint="chat", prompt_format=PromptFormat("text"))
    run = asyncio.run(run_bench([RequestSpec(0.0, 10, 5)], cfg))
    assert run.summary.num_finished == 1 and run.summary.total_output_tokens == 5


def test_cli_bench_writes_json(server: ServerThread, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--base-url", server.url, "--prompt-format", "tokens:65:91",
                 "--workload", "burst", "--rate", "40", "--cycle-length", "1",
                 "--num-requests", "20", "--lengths", "fixed:12:6", "--goodput", "ttft:1000",
                 "tpot:200", "--output", str(out), "--no-progress"])
    assert code == 0
    table = capsys.readouterr().out
    assert "TTFT median (ms)" in table and "QoE mean" in table and "goodput" in table
    data = json.loads(out.read_text())
    assert data["num_finished"] == 20 and len(data["requests"]) == 20
    for key in ("median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_e2el_ms",
                "request_throughput", "output_throughput", "request_goodput", "mean_qoe",
                "slo_attainment"):
        assert data[key] is not None, key
