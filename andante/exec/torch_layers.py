"""One transformer layer over the paged KV cache, in an exact and a fused form.

Design note. `ExactLayer` is Hugging Face's `LlamaDecoderLayer` computation (RMSNorm in
float32, `F.linear`, unfused SwiGLU): float32 runs use it and match transformers token
for token. `FusedLayer` is the bfloat16 fast path for a 2-core CPU, where a decode step
is bound by streaming the weights through GEMVs and by per-op dispatch. Each weight is
prepacked once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`,
as inductor's CPU freezing pass does: 1.5-2x the GEMV bandwidth of `F.linear` here),
and oneDNN epilogues absorb elementwise work: RMSNorm's weight is folded into the
following projection (W·diag(g)) and its per-row 1/rms is applied after the QKV GEMM
(rms(x)·W = (x·W)/rms commutes with the matmul); the softmax scale is folded into W_q;
both residual additions ride on the output and down GEMMs. SwiGLU is two GEMMs with
epilogues and no elementwise kernel: the gate GEMM applies SiLU ("swish") and the up
GEMM multiplies by that result ("mul"); measured against one fused gate/up GEMM followed
by SiLU and a multiply, the MLP took 7% less CPU time at 1 token and 11-15% less at
256-1024 tokens (the elementwise passes over [T, 2 * intermediate] cost more than the
extra GEMM call). That leaves about twenty kernels per decode layer. `torch.compile`
does not pay here (benchmarks/torch_compile_trial.py): inductor lowers these prepacked
calls only with the weights frozen as constants (a graph per layer), and compiling the
elementwise work between them halves its time at 2,048-token steps but adds ~10% at
decode sizes, after 10-25 s of compilation; so the layers stay eager.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from andante.exec.torch_attention import attention, write_kv
from andante.exec.torch_inputs import StepInputs
from andante.models.config import ModelConfig
from andante.models.rope import apply_rope
from andante.models.weights import LayerWeights

_mkldnn = torch.ops.mkldnn


def packed_gemm_supported(dtype: torch.dtype) -> bool:
    """oneDNN BF16 GEMMs with prepacked weights: bfloat16 on a CPU that has them."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(_mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def preferred_dtype() -> str:
    """The serving dtype for this CPU: bfloat16 where it has oneDNN bf16 GEMMs (AMX or
    AVX-512 BF16), else float32 (bf16 emulated in float32 is slower than float32)."""
    return "bfloat16" if packed_gemm_supported(torch.bfloat16) else "float32"


def pack(weight: torch.Tensor) -> torch.Tensor:
    return _mkldnn._reorder_linear_weight(weight.contiguous(), None)


class _Layer:
    """What both forms share: shapes, the layer's KV pool, RoPE and the cache write."""

    def __init__(self, config: ModelConfig, pool: torch.Tensor, slots: torch.Tensor) -> None:
        self.heads, self.kv_heads, self.dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps = config.rms_norm_eps
        self.pool = pool  # [2 kvh, blocks, block_size, dim]
        self.slots = slots  # the same memory, [2 kvh, blocks * block_size, dim]

    def _attend(self, qkv: torch.Tensor, inputs: StepInputs, cos: torch.Tensor,
                sin: torch.Tensor, scale: float | None) -> torch.Tensor:
        """RoPE, write the new K/V into their slots, attention; [T, heads * dim]."""
        heads, kvh, dim = self.heads, self.kv_heads, self.dim
        t = qkv.shape[0]
        split = (heads + kvh) * dim
        qk = apply_rope(qkv[:, :split].view(t, heads + kvh, dim), cos, sin)
        q, k = qk[:, :heads], qk[:, heads:]
        v = qkv[:, split:].view(t, kvh, dim)
        write_kv(self.slots, k, v, inputs)
        return attention(q, k, v, self.pool, inputs, kvh, scale)


class ExactLayer(_Layer):
    def __init__(self, config: ModelConfig, w: LayerWeights, pool: torch.Tensor,
                 slots: torch.Tensor) -> None:
        super().__init__(config, pool, slots)
        self.w = w
        self.inter = config.intermediate_size
        self.scale = config.head_dim ** -0.5

    def forward(self, x: torch.Tensor, inputs: StepInputs, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        w, hidden = self.w, (x.shape[1],)
        h = F.rms_norm(x, hidden, w.input_norm, self.eps)
        attn = self._attend(F.linear(h, w.qkv, w.qkv_bias), inputs, cos, sin, self.scale)
        x = x + F.linear(attn, w.o_proj)
        h = F.rms_norm(x, hidden, w.post_norm, self.eps)
        gate_up = F.linear(h, w.gate_up)
        act = F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:]
        return x + F.linear(act, w.down)


class FusedLayer(_Layer):
    def __init__(self, config: ModelConfig, w: LayerWeights, pool: torch.Tensor,
                 slots: torch.Tensor) -> None:
        super().__init__(config, pool, slots)
        inter, q_size = config.intermediate_size, config.q_size
        row_scale = torch.ones(w.qkv.shape[0], 1, dtype=torch.float32)
        row_scale[:q_size] = config.head_dim ** -0.5
        qkv = w.qkv.float() * w.input_norm.float() * row_scale
        self.qkv_w = pack(qkv.to(w.qkv.dtype))
        self.qkv_size = qkv.shape[0]
        self.qkv_b = None if w.qkv_bias is None else (
            w.qkv_bias.float() * row_scale[:, 0]).to(w.qkv.dtype)
        post = w.post_norm.float()
        self.o_w = pack(w.o_proj)
        gate_up = (w.gate_up.float() * post).to(w.gate_up.dtype)
        self.gate_w, self.up_w = pack(gate_up[:inter]), pack(gate_up[inter:])
        self.down_w = pack(w.down)
        self.eps_t = torch.tensor(self.eps, dtype=torch.float32)
        self.inv_hidden = 1.0 / config.hidden_size

    def _inv_rms(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        return torch.addcmul(self.eps_t, norm, norm, value=self.inv_hidden).rsqrt_().to(x.dtype)

    def forward(self, x: torch.Tensor, inputs: StepInputs, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        # a stride-0 expand: oneDNN takes a [T, 1] operand to its slow reference path
        scale = self._inv_rms(x).expand(x.shape[0], self.qkv_size)
        qkv = _mkldnn._linear_pointwise.binary(x, scale, self.qkv_w, None, "mul")
        if self.qkv_b is not None:
            qkv += self.qkv_b
        attn = self._attend(qkv, inputs, cos, sin, None)
        x = _mkldnn._linear_pointwise.binary(attn, x, self.o_w, None, "add")
        h = x * self._inv_rms(x)
        gate = _mkldnn._linear_pointwise(h, self.gate_w, None, "swish", [], "")
        act = _mkldnn._linear_pointwise.binary(h, gate, self.up_w, None, "mul")
        return _mkldnn._linear_pointwise.binary(act, x, self.down_w, None, "add")


class LMHead:
    """Final RMSNorm and projection to the vocabulary (prepacked when fused)."""

    def __init__(self, norm: torch.Tensor, weight: torch.Tensor, eps: float,
                 fused: bool) -> None:
        self.norm = norm
        self.eps = eps
        self.fused = fused
        self.weight = pack(weight) if fused else weight

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        rows = F.rms_norm(rows, (rows.shape[1],), self.norm, self.eps)
        if self.fused:
            return _mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "")
        return F.linear(rows, self.weight)
