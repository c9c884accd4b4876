"""TorchExecutor vs transformers: greedy tokens identical (float32), whatever the batching,
chunking, swapping or recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from andante.core import PreemptionMode, Request, SamplingParams
from andante.exec.batch import StepBatch
from andante.exec.torch_executor import TorchExecutor, TorchExecutorOptions
from andante.models import load_model
from andante.policies import SchedulerConfig
from tests.exec import policies
from tests.exec.engine_helpers import ScramblingExecutor, run_engine, tiny_executor
from tests.models.helpers import hf_greedy, make_tiny_checkpoint

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7], list(range(100, 141))]
NUM_TOKENS = 24


@pytest.fixture(scope="module")
def tiny(tiny_llama: Path):  # type: ignore[no-untyped-def]
    return load_model(tiny_llama, "float32")


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> list[list[int]]:
    return hf_greedy(tiny_llama, PROMPTS, NUM_TOKENS)


def outputs(requests: list[Request]) -> list[list[int]]:
    return [list(r.output_token_ids) for r in requests]


def test_greedy_matches_transformers(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    requests, _ = run_engine(tiny_executor(tiny), PROMPTS, NUM_TOKENS)
    assert outputs(requests) == reference


def test_staggered_arrivals_mix_prefill_and_decode(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    requests, _ = run_engine(tiny_executor(tiny), PROMPTS, NUM_TOKENS,
                             policy="sarathi", arrivals=[0, 2, 3, 7])
    assert outputs(requests) == reference


def test_chunked_prefill_matches(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    requests, engine = run_engine(tiny_executor(tiny), PROMPTS, NUM_TOKENS,
                                  policy="sarathi", policy_options={"token_budget": 8})
    assert outputs(requests) == reference
    assert engine.num_steps > NUM_TOKENS + 10  # the long prompts really were chunked


def test_swap_out_and_in_matches(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    executor = ScramblingExecutor(tiny_executor(tiny))
    requests, engine = run_engine(executor, PROMPTS, NUM_TOKENS, policy=policies.POLICY,
                                  policy_options={"victim": "r1", "mode": "swap",
                                                  "at_step": 6})
    assert requests[1].timeline.num_swaps_out == 1
    assert executor.swap_times and executor.swap_times[0] > 0.0
    assert outputs(requests) == reference


def test_recompute_matches(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    requests, _ = run_engine(tiny_executor(tiny), PROMPTS, NUM_TOKENS,
                             policy=policies.POLICY,
                             policy_options={"victim": "r3", "mode": "recompute",
                                             "at_step": 9})
    assert requests[3].timeline.num_recomputes == 1
    assert outputs(requests) == reference


def test_kv_shortage_preempts_and_still_matches(tiny, reference) -> None:  # type: ignore[no-untyped-def]
    for mode in (PreemptionMode.RECOMPUTE, PreemptionMode.SWAP):
        config = SchedulerConfig(max_model_len=512, max_num_batched_tokens=512,
                                 preemption_mode=mode, watermark=0.0)
        requests, engine = run_engine(tiny_executor(tiny, device_blocks=10), PROMPTS,
                                      NUM_TOKENS, config=config)
        assert engine.scheduler.num_preemptions > 0
        assert outputs(requests) == reference


@pytest.mark.parametrize("arch,overrides", [
    ("llama", {"tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 500.0}),
    ("qwen2", {}),
])
def test_variants_match_transformers(tmp_path: Path, arch: str, overrides: dict) -> None:  # type: ignore[type-arg]
    directory = make_tiny_checkpoint(tmp_path / arch, arch=arch, seed=3, **overrides)
    prompts = PROMPTS[:2]
    model = load_model(directory, "float32")
    requests, _ = run_engine(tiny_executor(model), prompts, 16)
    assert outputs(requests) == hf_greedy(directory, prompts, 16)


def test_prefill_logits_close_to_transformers(tiny_llama: Path, tiny) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    prompt = PROMPTS[1]
    with torch.inference_mode():
        expected = hf(torch.tensor([prompt])).logits[0, -1]
    executor = tiny_executor(tiny)
    table = list(range(4))
    req = Request("x", prompt, SamplingParams(temperature=0.0), 0.0)
    batch = StepBatch([req], [len(prompt)], [0], [True], [table])
    inputs = executor.inputs.build(batch)
    with torch.inference_mode():
        logits = executor.runner.forward(inputs)[0]
    assert torch.allclose(logits, expected, atol=1e-4, rtol=1e-4)


def test_bfloat16_runs_and_mostly_agrees(tiny_llama: Path, reference) -> None:  # type: ignore[no-untyped-def]
    model = load_model(tiny_llama, "bfloat16")
    executor = TorchExecutor(model, TorchExecutorOptions(kv_cache_gib=0.01,
                                                         swap_space_gib=0.0))
    requests, _ = run_engine(executor, PROMPTS, NUM_TOKENS)
    first = [r.output_token_ids[0] for r in requests]
    assert sum(a == b[0] for a, b in zip(first, reference, strict=True)) >= 3


def test_num_kv_blocks_from_memory_budget(tiny) -> None:  # type: ignore[no-untyped-def]
    executor = TorchExecutor(tiny, TorchExecutorOptions(dtype="float32", kv_cache_gib=0.001,
                                                        swap_space_gib=0.002))
    per_block = tiny.config.with_dtype(4).kv_bytes_per_token * 16
    device, host = executor.num_kv_blocks(16)
    assert device == int(0.001 * (1 << 30) // per_block) > 0
    assert host == int(0.002 * (1 << 30) // per_block)
    with pytest.raises(ValueError, match="block size"):
        executor.num_kv_blocks(32)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="dtype"):
        TorchExecutorOptions(dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_gib"):
        TorchExecutorOptions(kv_cache_gib=0)
    with pytest.raises(ValueError, match="num_threads"):
        TorchExecutorOptions(num_threads=0)


def test_cost_model_falls_back_to_default(tiny, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from andante.exec.torch_cost import DEFAULT_CPU

    monkeypatch.setenv("ANDANTE_HOME", str(tmp_path))
    executor = tiny_executor(tiny)
    assert executor.cost_model.hardware == DEFAULT_CPU
    assert executor.cost_model.model.dtype_bytes == 4


def test_long_prompts_span_several_query_chunks(tiny_llama: Path, tiny) -> None:  # type: ignore[no-untyped-def]
    prompts = [[(7 * i) % 300 + 5 for i in range(300)], [(11 * i) % 300 + 5 for i in range(260)]]
    expected = hf_greedy(tiny_llama, prompts, 8)
    whole, _ = run_engine(tiny_executor(tiny), prompts, 8)
    assert outputs(whole) == expected
    chunked, _ = run_engine(tiny_executor(tiny), prompts, 8, policy="sarathi",
                            policy_options={"token_budget": 200})
    assert outputs(chunked) == expected
