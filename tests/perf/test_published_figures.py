"""Order-of-magnitude checks of the calibrated model against published measurements.

Each figure is cited in andante/perf/hardware.py, where the coefficients come from. The
bound is a factor of 2: the figures mix engines (vLLM, TensorRT-LLM, NIM) and include
serving overheads that a step model leaves out.
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


def _within_factor(predicted: float, published: float, factor: float = 2.0) -> bool:
    return published / factor <= predicted <= published * factor


def test_decode_itl_llama31_8b_a100_40g():
    # [P1] johnmusgrave.com "vLLM throughput-latency sweep on NVIDIA A100": vLLM 0.23,
    # Llama-3.1-8B BF16, A100 40GB, 1024 in / 128 out, concurrency 1: ~75 tok/s.
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-40g"))
    predicted = model.decode_time(1, 1024 + 64)
    assert _within_factor(predicted, 1 / 75)
    assert predicted == pytest.approx(1 / 75, rel=0.1)  # it is the calibration point


def test_ttft_500_tokens_llama31_8b_a100_80g():
    # [P2] NVIDIA NIM Llama 3.1 Nemotron Safety Guard 8B (Llama-3.1-8B) performance page,
    # A100 80GB SXM, BF16, 500 input tokens, concurrency 1: TTFT 48.3 ms.
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    assert _within_factor(model.prefill_time(500), 48.3e-3)


def test_300k_token_prefill_llama3_8b_a100():
    # [P3] MInference (NeurIPS 2024) Fig. 1(b) / microsoft/MInference#84: Llama-3-8B,
    # 300K-token prompt on one A100: about 3 minutes of pre-filling.
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    assert _within_factor(model.prefill_time(300_000), 180.0)


@pytest.mark.parametrize(
    ("hardware", "batch_size", "published_ms"),
    [("a100-80g", 1, 234.0), ("a100-80g", 8, 329.5),
     ("h100-80g", 1, 153.8), ("h100-80g", 8, 199.2)],
)
def test_nemo_llama2_7b_128_in_20_out(hardware, batch_size, published_ms):
    # [P4] NeMo Framework Llama-2 inference performance (TensorRT-LLM, TP1),
    # 128 input / 20 output tokens, average request latency.
    model = CostModel(LLAMA_2_7B, get_hardware(hardware))
    total = model.step_time(BatchShape.prefill(128, batch_size))
    total += sum(model.decode_time(batch_size, 128 + i) for i in range(19))
    assert _within_factor(total, published_ms / 1e3)


def test_tp4_llama_70b_batch_64_a100_80g():
    # vLLM PR #2192 (custom all-reduce): Llama 70B, A100-80G, TP4, batch 64,
    # 256 in / 256 out, benchmark_latency: 14.57 s.
    llama2_70b = ModelSpec(name="llama-2-70b", num_layers=80, hidden_size=8192,
                           num_heads=64, num_kv_heads=8, head_dim=128,
                           intermediate_size=28672, vocab_size=32000)
    model = CostModel(llama2_70b, get_hardware("a100-80g"), tp=4)
    total = model.step_time(BatchShape.prefill(256, 64))
    total += sum(model.decode_time(64, 256 + i) for i in range(255))
    assert _within_factor(total, 14.57)


def test_fastserve_decode_iteration_opt_13b():
    # FastServe (seeds/004) §6.1: latency SLO 0.3 s = 10x a single decode iteration
    # from their profiling, OPT on A100 40GB -> about 30 ms per iteration.
    model = CostModel(get_model("opt-13b"), get_hardware("a100-40g"))
    assert _within_factor(model.decode_time(8, 512), 0.03)
