"""Built-in model shapes, copied from each model's public Hugging Face `config.json`.

Field map: num_hidden_layers -> num_layers, hidden_size, num_attention_heads ->
num_heads, num_key_value_heads -> num_kv_heads (absent = num_heads), head_dim
(absent = hidden_size / num_attention_heads), intermediate_size (OPT: ffn_dim),
vocab_size, tie_word_embeddings (absent = true, the transformers default),
max_position_embeddings -> max_model_len. All weights BF16/FP16 (2 bytes).
"""

from __future__ import annotations

from andante.perf.specs import ModelSpec

BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-3.1-8B-Instruct
    ModelSpec(name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=131072),
    # mistralai/Mistral-7B-Instruct-v0.3 (no sliding window, 32768-token vocabulary)
    ModelSpec(name="mistral-7b", num_layers=32, hidden_size=4096, num_heads=32,
              num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32768,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=32768),
    # lmsys/vicuna-13b-v1.5 (a Llama-2-13B fine-tune: MHA, 4096-token context); the
    # Vicuna-13B of QLM §8
    ModelSpec(name="vicuna-13b", num_layers=40, hidden_size=5120, num_heads=40,
              num_kv_heads=40, head_dim=128, intermediate_size=13824, vocab_size=32000,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=4096),
    # Qwen/Qwen2.5-14B-Instruct (QKV biases not counted)
    ModelSpec(name="qwen2.5-14b", num_layers=48, hidden_size=5120, num_heads=40,
              num_kv_heads=8, head_dim=128, intermediate_size=13824, vocab_size=152064,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=32768),
    # Qwen/Qwen2.5-72B-Instruct (QKV biases not counted); KunServe §5 serves it with TP4
    ModelSpec(name="qwen2.5-72b", num_layers=80, hidden_size=8192, num_heads=64,
              num_kv_heads=8, head_dim=128, intermediate_size=29568, vocab_size=152064,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=32768),
    # meta-llama/Llama-3.1-70B-Instruct; served with tensor parallelism 4 or 8
    ModelSpec(name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64,
              num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=131072),
    # microsoft/Phi-3-mini-4k-instruct (MHA; fused gate_up_proj = SwiGLU)
    ModelSpec(name="phi-3-mini", num_layers=32, hidden_size=3072, num_heads=32,
              num_kv_heads=32, head_dim=96, intermediate_size=8192, vocab_size=32064,
              mlp_kind="gated", tie_word_embeddings=False, max_model_len=4096),
    # facebook/opt-13b (ReLU fc1/fc2 MLP, learned positions not counted, tied LM head)
    ModelSpec(name="opt-13b", num_layers=40, hidden_size=5120, num_heads=40,
              num_kv_heads=40, head_dim=128, intermediate_size=20480, vocab_size=50272,
              mlp_kind="plain", tie_word_embeddings=True, max_model_len=2048),
    # HuggingFaceTB/SmolLM2-135M (small enough for CPU runs and tests)
    ModelSpec(name="smollm2-135m", num_layers=30, hidden_size=576, num_heads=9,
              num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152,
              mlp_kind="gated", tie_word_embeddings=True, max_model_len=8192),
)
