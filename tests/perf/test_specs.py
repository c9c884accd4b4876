import json

import pytest

from andante.perf.catalog import get_hardware, get_model
from andante.perf.specs import CostCoefficients, HardwareSpec, ModelSpec

KIB = 1024


def test_llama_8b_counts_match_published_size():
    spec = get_model("llama-3.1-8b")
    assert spec.num_params == pytest.approx(8.03e9, rel=0.005)  # "8B": 8,030,261,248
    assert spec.kv_bytes_per_token == 128 * KIB
    assert spec.dense_flops_per_token == 2 * 32 * spec.dense_params_per_layer


def test_qwen_kv_bytes_match_kunserve():
    # KunServe §2: "serving a Qwen-2.5-14B model, where each token consumes 192 KB".
    assert get_model("qwen2.5-14b").kv_bytes_per_token == 192 * KIB


def test_tied_embeddings_are_counted_once():
    opt = get_model("opt-13b")
    assert opt.tie_word_embeddings and opt.mlp_kind == "plain"
    assert opt.num_params == pytest.approx(12.84e9, rel=0.01)
    assert opt.streamed_weight_bytes == opt.weight_bytes  # tied LM head is streamed
    llama = get_model("llama-3.1-8b")
    assert llama.streamed_weight_bytes == llama.weight_bytes - llama.embedding_params * 2


def test_gated_mlp_has_three_matrices():
    smol = get_model("smollm2-135m")
    assert smol.mlp_params_per_layer == 3 * 576 * 1536
    assert smol.num_params == pytest.approx(134.5e6, rel=0.01)


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_layers", 0), ("hidden_size", -1), ("num_kv_heads", 5), ("mlp_kind", "moe"),
     ("dtype_bytes", 1.5), ("name", "")],
)
def test_invalid_model_spec_names_the_value(field, value):
    fields = dict(name="m", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=100)
    fields[field] = value
    with pytest.raises(ValueError, match=field):
        ModelSpec(**fields)


def test_coefficients_reject_negative_and_nan():
    with pytest.raises(ValueError, match="c3"):
        CostCoefficients(c3=-0.1)
    with pytest.raises(ValueError, match="c5"):
        CostCoefficients(c5=float("nan"))


def test_hardware_json_round_trip():
    spec = get_hardware("h100-80g")
    text = spec.to_json()
    assert HardwareSpec.from_json(text) == spec
    assert json.loads(text)["coefficients"]["c4"] == spec.coefficients.c4


def test_hardware_json_round_trip_custom_profile():
    spec = HardwareSpec(name="cpu", peak_flops=1e12, mem_bandwidth=50e9,
                        mem_capacity=64 << 30, host_link_bandwidth=10e9,
                        interconnect_bandwidth=10e9,
                        coefficients=CostCoefficients(0.1, 0.9, 0.2, 0.3, 1e-3),
                        collective_latency=0.0)
    assert HardwareSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json", "not valid JSON"),
     ("[]", "JSON object"),
     ('{"name": "x"}', "lacks keys"),
     ('{"name": "x", "bogus": 1}', "unknown"),
     ('{"version": 99}', "version")],
)
def test_hardware_from_json_rejects_bad_profiles(text, message):
    with pytest.raises(ValueError, match=message):
        HardwareSpec.from_json(text)


def test_hardware_rejects_non_positive_rates():
    with pytest.raises(ValueError, match="mem_bandwidth"):
        HardwareSpec(name="x", peak_flops=1e12, mem_bandwidth=0.0, mem_capacity=1,
                     host_link_bandwidth=1.0, interconnect_bandwidth=1.0)
