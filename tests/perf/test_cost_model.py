import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel, GiB
from andante.perf.shape import BatchShape


@pytest.fixture
def llama_a100() -> CostModel:
    return CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 32768)), min_size=1,
                  max_size=16)


@settings(max_examples=200, deadline=None)
@given(chunks, st.integers(1, 512), st.integers(0, 4096))
def test_more_tokens_or_context_never_takes_less_time(base, extra_tokens, extra_context):
    model = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    before = model.step_time(BatchShape.of(base))
    (new, cached), rest = base[0], base[1:]
    more_tokens = BatchShape.of([(new + extra_tokens, cached), *rest])
    more_context = BatchShape.of([(new, cached + extra_context), *rest])
    more_seqs = BatchShape.of([*base, (extra_tokens, extra_context)])
    assert model.step_time(more_tokens) >= before
    assert model.step_time(more_context) >= before
    assert model.step_time(more_seqs) >= before


@pytest.mark.parametrize("hardware", ["a10-24g", "a100-40g", "a100-80g", "h100-80g"])
def test_decode_and_prefill_grow_with_size(hardware):
    model = CostModel(get_model("mistral-7b"), get_hardware(hardware))
    decodes = [model.decode_time(b, c) for b in (1, 8, 64, 256) for c in (128, 4096)]
    assert all(t > 0 for t in decodes)
    assert model.decode_time(64, 4096) > model.decode_time(64, 128)
    assert model.decode_time(256, 1024) > model.decode_time(8, 1024)
    prefills = [model.prefill_time(n) for n in (1, 16, 256, 2048, 16384)]
    assert prefills == sorted(prefills)
    assert model.prefill_time(512, num_cached=8192) > model.prefill_time(512)


def test_tensor_parallelism_speeds_up_a_big_model():
    model, hw = get_model("llama-3.1-70b"), get_hardware("a100-80g")
    tp4, tp8 = CostModel(model, hw, tp=4), CostModel(model, hw, tp=8)
    assert tp8.decode_time(32, 1024) < tp4.decode_time(32, 1024)
    assert tp8.prefill_time(4096) < tp4.prefill_time(4096)
    assert tp4.comm_time(1) > 0 and CostModel(model, hw, tp=1).comm_time(1) == 0


def test_decode_is_memory_bound_and_long_prefill_compute_bound(llama_a100):
    t_m, t_f = llama_a100.terms(BatchShape.decode(1, 1024))
    assert t_m > 100 * t_f
    t_m, t_f = llama_a100.terms(BatchShape.decode(32, 1024))
    assert t_m > 3 * t_f
    t_m, t_f = llama_a100.terms(BatchShape.prefill(4096))
    assert t_f > 5 * t_m


def test_shortcuts_agree_with_batch_shapes(llama_a100):
    assert llama_a100.prefill_time(700, 300) == pytest.approx(
        llama_a100.step_time(BatchShape.of([(700, 300)])))
    assert llama_a100.decode_time(48, 900) == pytest.approx(
        llama_a100.step_time(BatchShape.decode(48, 900)))
    assert llama_a100.prefill_time(700, 300) > llama_a100.prefill_time(700)  # attention
    assert llama_a100.step_time(BatchShape()) == 0.0
    assert llama_a100.prefill_time(0) == 0.0 and llama_a100.decode_time(0, 10) == 0.0


def test_swap_time_is_bytes_over_host_link(llama_a100):
    # 1000 tokens x 128 KiB over 25 GB/s.
    assert llama_a100.swap_time(1000) == pytest.approx(1000 * 131072 / 25e9)
    sharded = CostModel(get_model("llama-3.1-70b"), get_hardware("a100-80g"), tp=4)
    assert sharded.kv_bytes_per_token == get_model("llama-3.1-70b").kv_bytes_per_token


def test_kv_capacity_is_sane(llama_a100):
    tokens = llama_a100.kv_capacity_tokens()
    # 80 GiB x 0.9 - 15 GiB weights - 2 GiB reserve = 55 GiB at 128 KiB per token.
    assert 400_000 < tokens < 500_000
    assert llama_a100.kv_capacity_tokens(0.5) < tokens
    big = CostModel(get_model("llama-3.1-70b"), get_hardware("h100-80g"), tp=8)
    assert big.kv_capacity_tokens() > 1_000_000


def test_weights_that_do_not_fit_raise():
    with pytest.raises(ValueError, match="does not fit"):
        CostModel(get_model("llama-3.1-70b"), get_hardware("a100-80g")).kv_capacity_tokens()
    with pytest.raises(ValueError, match="does not fit"):
        CostModel(get_model("opt-13b"), get_hardware("a10-24g")).kv_capacity_tokens()
    model = CostModel(get_model("smollm2-135m"), get_hardware("a10-24g"))
    with pytest.raises(ValueError, match="activation_reserve_bytes"):
        model.kv_capacity_tokens(activation_reserve_bytes=-GiB)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        model.kv_capacity_tokens(1.5)


@pytest.mark.parametrize("tp", [0, 3, -1])
def test_invalid_tensor_parallelism(tp):
    with pytest.raises(ValueError, match="tp"):
        CostModel(get_model("llama-3.1-70b"), get_hardware("h100-80g"), tp=tp)


def test_kv_heads_are_replicated_beyond_their_count():
    smol = get_model("smollm2-135m")  # 9 heads, 3 KV heads
    model = CostModel(smol, get_hardware("a100-40g"), tp=3)
    assert model.kv_bytes_per_token_per_gpu == smol.kv_bytes_per_token // 3
    with pytest.raises(ValueError, match="tp"):
        CostModel(get_model("phi-3-mini"), get_hardware("a100-40g"), tp=3)


def test_negative_counts_are_rejected(llama_a100):
    with pytest.raises(ValueError, match="num_tokens"):
        llama_a100.prefill_time(-1)
    with pytest.raises(ValueError, match="context_len"):
        llama_a100.decode_time(1, -5)
    with pytest.raises(ValueError, match="num_tokens"):
        llama_a100.swap_time(-3)
