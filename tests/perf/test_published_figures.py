"""The calibrated cost model against published measurements, each at its own tolerance.

Each figure is cited in andante/perf/hardware.py. Two kinds of check:
- fitted figures (P1-P3): the coefficients were chosen to reproduce them, so the model
  must land within the precision the source states ("~75 tok/s": two significant
  digits; "48.3 ms"; "about 3 minutes");
- held-out figures (P4, vLLM PR #2192, FastServe §6.1): not used in the fit. P4 and the
  PR are end-to-end serving latencies (TensorRT-LLM/Triton, vLLM's benchmark_latency)
  which sit a near-constant 1.15-1.30x above a pure step model on Ampere (per-request
  serving overhead, hardware.py's calibration note); FastServe states "about 30 ms" per
  decode iteration, read as +-20%.
- P4 on Hopper is where the published figures and the H200 measurement (M1) disagree:
  the Hopper coefficients follow M1, plain PyTorch, whose per-step cost is higher than
  TensorRT-LLM's fused kernels', so the model now sits at or above P4's own end-to-end
  latencies (hardware.py says why it follows M1). Kept visible as its own test.
"""

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.perf.specs import ModelSpec

# meta-llama/Llama-2-7b-hf config.json (not in the catalog; used by the NeMo table).
LLAMA_2_7B = ModelSpec(name="llama-2-7b", num_layers=32, hidden_size=4096, num_heads=32,
                       num_kv_heads=32, head_dim=128, intermediate_size=11008,
                       vocab_size=32000, max_model_len=4096)
LLAMA_2_70B = ModelSpec(name="llama-2-70b", num_layers=80, hidden_size=8192, num_heads=64,
                        num_kv_heads=8, head_dim=128, intermediate_size=28672,
                        vocab_size=32000)
#: Published end-to-end latency over the step model's, for serving-stack figures.
SERVING_OVERHEAD = (1.15, 1.30)


def _request_latency(model: CostModel, prompt: int, output: int, batch: int) -> float:
    """Prefill `batch` prompts at once, then decode `output - 1` steps."""
    total = model.step_time(BatchShape.prefill(prompt, batch))
    return total + sum(model.decode_time(batch, prompt + i) for i in range(output - 1))


def test_p1_decode_rate_llama31_8b_a100_40g_is_reproduced_to_two_digits():
    # [P1] vLLM 0.23, Llama-3.1-8B BF16, A100 40GB, 1024 in / 128 out, concurrency 1:
    # "~75 tok/s" (the mid-generation context is 1024 + 64 tokens).
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-40g"))
    assert 74.5 <= 1 / model.decode_time(1, 1024 + 64) < 75.5


def test_p2_ttft_500_tokens_llama31_8b_a100_80g_within_one_percent():
    # [P2] NVIDIA NIM (Llama-3.1-8B), A100 80GB SXM, 500 input tokens: TTFT 48.3 ms.
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    assert model.prefill_time(500) == pytest.approx(48.3e-3, rel=0.01)


def test_p3_300k_token_prefill_llama3_8b_a100_about_three_minutes():
    # [P3] MInference Fig. 1(b) / microsoft/MInference#84: 300K tokens, one A100,
    # "about 3 minutes" of prefill: 2.5-3.5 minutes.
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    assert 150.0 <= model.prefill_time(300_000) <= 210.0


P4_A100 = (234.0, 249.6, 272.6, 329.5)  # ms at batch 1, 2, 4, 8
P4_H100 = (153.8, 160.8, 174.8, 199.2)


def _p4_ratios(hardware: str, table: tuple[float, ...]) -> list[float]:
    """P4's published latency over the model's, at batch 1, 2, 4 and 8."""
    model = CostModel(LLAMA_2_7B, get_hardware(hardware))
    return [published_ms / 1e3 / _request_latency(model, 128, 20, batch)
            for batch, published_ms in zip((1, 2, 4, 8), table, strict=True)]


def test_p4_nemo_llama2_7b_a100_sits_a_near_constant_serving_overhead_above_the_model():
    # [P4] NeMo Framework Llama-2 (TensorRT-LLM, TP1), 128 in / 20 out, request latency.
    ratios = _p4_ratios("a100-80g", P4_A100)
    assert all(SERVING_OVERHEAD[0] <= r <= SERVING_OVERHEAD[1] for r in ratios)
    assert max(ratios) - min(ratios) <= 0.1


def test_p4_h100_shows_where_the_h200_measurement_and_tensorrt_llm_disagree():
    # The Hopper model follows M1 (plain PyTorch): at small batches its steps are slower
    # than TensorRT-LLM's, so P4 sits 0.87-0.99x the model instead of a serving overhead
    # above it; the gap closes as the batch grows and the fixed cost per step matters less.
    ratios = _p4_ratios("h100-80g", P4_H100)
    assert all(0.80 <= r < SERVING_OVERHEAD[0] for r in ratios)
    assert ratios == sorted(ratios)


def test_vllm_pr2192_tp4_llama_70b_batch_64_a100_80g():
    # vLLM PR #2192 (custom all-reduce): Llama 70B, A100-80G, TP4, batch 64,
    # 256 in / 256 out, benchmark_latency: 14.57 s.
    model = CostModel(LLAMA_2_70B, get_hardware("a100-80g"), tp=4)
    ratio = 14.57 / _request_latency(model, 256, 256, 64)
    assert SERVING_OVERHEAD[0] <= ratio <= SERVING_OVERHEAD[1]


def test_fastserve_decode_iteration_opt_13b_about_30_ms():
    # FastServe (seeds/004) §6.1: latency SLO 0.3 s = 10x a single decode iteration
    # from their profiling, OPT on A100 40GB: "about" 30 ms per iteration.
    model = CostModel(get_model("opt-13b"), get_hardware("a100-40g"))
    assert model.decode_time(8, 512) == pytest.approx(0.03, rel=0.2)
