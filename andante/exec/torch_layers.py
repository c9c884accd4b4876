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
extra GEMM call). That leaves about twenty kernels per decode layer. Those measurements
were taken on a CPU with AMX; on one without (AVX-512 BF16 only) each binary post-op
cost ~15 us at decode sizes and the plain form won (an RMSNorm kernel, post-op-free
GEMMs, one gate/up GEMM, SiLU-multiply in float32, in-place residual adds), so both
forms exist
(`Shape.epilogues`) and the executor times them at start-up and packs the weights for
the faster (andante.exec.torch_layer_form). `torch.compile`
does not pay here (benchmarks/torch_compile_trial.py): inductor lowers these prepacked
calls only with the weights frozen as constants (a graph per layer), and compiling the
elementwise work between them halves its time at 2,048-token steps but adds ~10% at
decode sizes, after 10-25 s of compilation; so the layers stay eager.

What stays is Python's own cost: a decode layer is about 45 torch calls (17 kernels, the
rest views), and at batch 16 the stepping thread spent about twice the OpenMP worker's
CPU time per step, the difference being serial work: Python dispatch, small kernels,
each GEMM's fixed cost. So the fused layer is TorchScript (`torch.jit.script`, no fusion
or compilation: the same kernels in the same order, bit-identical outputs) and a step
runs all its layers in one scripted call (`run_layers`). Measured, together with the
in-place RoPE and the K/V writes without a concatenation (andante.models.rope,
andante.exec.torch_attention), against the previous eager layers on a busy machine (two
threads, OMP_WAIT_POLICY=PASSIVE, three interleaved rounds, medians of the stepping
thread's CPU time per forward pass): a batch-16 decode step at context 160 46.5 -> 41.3
ms, a mixed step of 8 decodes and 8 fresh 128-token prompts 310 -> 269 ms (process CPU
515 -> 462 ms); the layer loop alone, 36.6-40.4 -> 30.6-32.8 ms. TorchScript's
interpreter itself costs about 2 ms of a batch-8 decode step. The float32 `ExactLayer`
shares the scripted attention and runs its layers from Python.
"""

# no `from __future__ import annotations`: TorchScript cannot resolve the postponed
# annotations of NamedTuples used inside lists
from collections.abc import Sequence
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from andante.exec.torch_attention import AttentionPlan, attention, attention_plan, write_kv
from andante.exec.torch_inputs import StepInputs
from andante.models.rope import apply_rope_
from andante.models.torchscript import script
from andante.models.weights import LayerWeights
from andante.perf.specs import ModelSpec

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


class Shape(NamedTuple):
    """Head counts and sizes of a layer, its RMSNorm constants (eps as a float32 tensor
    and as a float, 1 / hidden size), its intermediate size, and its form: oneDNN
    epilogues (True) or plain GEMMs with separate elementwise kernels (see the note)."""

    heads: int
    kv_heads: int
    dim: int
    eps: torch.Tensor
    inv_hidden: float
    eps_value: float
    inter: int
    epilogues: bool


class FusedWeights(NamedTuple):
    """One fused layer's prepacked weights (see the module note) and its KV pool, as a
    [2 kvh, blocks, bs, D] tensor and as [2 kvh, blocks * bs, D] slots (same memory).
    The plain form packs gate and up as one GEMM in `gate` (`up` is empty)."""

    qkv: torch.Tensor
    qkv_bias: Optional[torch.Tensor]  # noqa: UP045 (TorchScript's NamedTuple needs Optional)
    o: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    pool: torch.Tensor
    slots: torch.Tensor


@script
def attend(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pool: torch.Tensor,
           slots: torch.Tensor, plan: AttentionPlan, heads: int, kv_heads: int, dim: int,
           scale: float | None) -> torch.Tensor:
    """RoPE, write the new K/V into their slots, attention; [rows, heads * dim]. Only
    the step's T real rows (`plan.write_slots`) attend; the pad rows of a bucketed step
    (rows > T, see andante.perf.step_sizes) come out as zeros."""
    rows, t = qkv.shape[0], plan.write_slots.shape[0]
    if rows > t:
        qkv = qkv[:t]
    # RoPE in place, so that the rotated K stays next to V in `qkv`'s rows: one K/V write
    qk = apply_rope_(qkv[:, :(heads + kv_heads) * dim].view(t, heads + kv_heads, dim),
                     cos, sin)
    kv = qkv[:, heads * dim:].view(t, 2 * kv_heads, dim)
    write_kv(slots, kv, plan.write_slots)
    out = attention(qk[:, :heads], kv[:, :kv_heads], kv[:, kv_heads:], pool, plan,
                    kv_heads, scale)
    if rows > t:
        out = torch.cat([out, out.new_zeros(rows - t, out.shape[1])])
    return out


@script
def _inv_rms(x: torch.Tensor, shape: Shape) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x, 2.0, [-1], True, dtype=torch.float32)
    return torch.addcmul(shape.eps, norm, norm, value=shape.inv_hidden).rsqrt_().to(x.dtype)


@script
def project_qkv(x: torch.Tensor, w: FusedWeights, shape: Shape) -> torch.Tensor:
    """The input RMSNorm and the QKV projection of the step's rows `x` [T, hidden]."""
    if shape.epilogues:
        # a stride-0 expand: oneDNN takes a [T, 1] operand to its slow reference path
        qkv_size = (shape.heads + 2 * shape.kv_heads) * shape.dim
        scale = _inv_rms(x, shape).expand(x.shape[0], qkv_size)
        qkv = _mkldnn._linear_pointwise(x, scale, w.qkv, None, "mul")
    else:
        h = torch.rms_norm(x, [x.shape[1]], None, shape.eps_value)
        qkv = _mkldnn._linear_pointwise(h, w.qkv, None, "none", [], "")
    bias = w.qkv_bias
    if bias is not None:
        qkv += bias
    return qkv


@script
def output_and_mlp(attn: torch.Tensor, x: torch.Tensor, w: FusedWeights,
                   shape: Shape) -> torch.Tensor:
    """The output projection and residual, the post-attention RMSNorm, SwiGLU and the
    second residual: the layer's output rows."""
    if shape.epilogues:
        x = _mkldnn._linear_pointwise(attn, x, w.o, None, "add")
        h = x * _inv_rms(x, shape)
        gate = _mkldnn._linear_pointwise(h, w.gate, None, "swish", [], "")
        act = _mkldnn._linear_pointwise(h, gate, w.up, None, "mul")
        return _mkldnn._linear_pointwise(act, x, w.down, None, "add")
    x = _mkldnn._linear_pointwise(attn, w.o, None, "none", [], "").add_(x)
    h = torch.rms_norm(x, [x.shape[1]], None, shape.eps_value)
    # SiLU and the product in float32, as the epilogues compute them: in bf16 they put
    # SmolLM2's logits 4.8% from float32's instead of 3.0% (relative L2)
    gate_up = _mkldnn._linear_pointwise(h, w.gate, None, "none", [], "").float()
    act = F.silu(gate_up[:, :shape.inter]).mul_(gate_up[:, shape.inter:]).to(x.dtype)
    return _mkldnn._linear_pointwise(act, w.down, None, "none", [], "").add_(x)


@script
def fused_layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, w: FusedWeights,
                plan: AttentionPlan, shape: Shape) -> torch.Tensor:
    """One `FusedLayer` over the step's rows `x` [T, hidden]."""
    qkv = project_qkv(x, w, shape)
    attn = attend(qkv, cos, sin, w.pool, w.slots, plan, shape.heads, shape.kv_heads,
                  shape.dim, None)
    return output_and_mlp(attn, x, w, shape)


@script
def fused_stack(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                layers: list[FusedWeights], plan: AttentionPlan, shape: Shape) -> torch.Tensor:
    """`fused_layer` over each of `layers` in turn: a whole step in one scripted call."""
    for w in layers:
        x = fused_layer(x, cos, sin, w, plan, shape)
    return x


class _Layer:
    """What both forms share: shapes and the layer's KV pool."""

    def __init__(self, config: ModelSpec, pool: torch.Tensor, slots: torch.Tensor) -> None:
        self.heads, self.kv_heads, self.dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps = config.rms_norm_eps
        self.pool = pool  # [2 kvh, blocks, block_size, dim]
        self.slots = slots  # the same memory, [2 kvh, blocks * block_size, dim]

    def bind_kv(self, pool: torch.Tensor, slots: torch.Tensor) -> None:
        """Use another KV pool of the same layout (sleep mode re-allocates it)."""
        self.pool, self.slots = pool, slots


class ExactLayer(_Layer):
    def __init__(self, config: ModelSpec, w: LayerWeights, pool: torch.Tensor,
                 slots: torch.Tensor) -> None:
        super().__init__(config, pool, slots)
        self.w = w
        self.inter = config.intermediate_size
        self.scale = config.head_dim ** -0.5

    def forward(self, x: torch.Tensor, inputs: StepInputs, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        w, hidden = self.w, (x.shape[1],)
        h = F.rms_norm(x, hidden, w.input_norm, self.eps)
        attn = attend(F.linear(h, w.qkv, w.qkv_bias), cos, sin, self.pool, self.slots,
                      attention_plan(inputs, self.pool), self.heads, self.kv_heads,
                      self.dim, self.scale)
        x = x + F.linear(attn, w.o_proj)
        h = F.rms_norm(x, hidden, w.post_norm, self.eps)
        gate_up = F.linear(h, w.gate_up)
        act = F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:]
        return x + F.linear(act, w.down)


def layer_shape(config: ModelSpec, epilogues: bool) -> Shape:
    return Shape(config.num_heads, config.num_kv_heads, config.head_dim,
                 torch.tensor(config.rms_norm_eps, dtype=torch.float32),
                 1.0 / config.hidden_size, config.rms_norm_eps, config.intermediate_size,
                 epilogues)


def fused_weights(config: ModelSpec, w: LayerWeights, pool: torch.Tensor,
                  slots: torch.Tensor, epilogues: bool) -> FusedWeights:
    """A layer's weights prepacked for its form, the RMSNorm weights and the softmax
    scale folded in (see the module note)."""
    inter, q_size = config.intermediate_size, config.q_size
    row_scale = torch.ones(w.qkv.shape[0], 1, dtype=torch.float32)
    row_scale[:q_size] = config.head_dim ** -0.5
    qkv = w.qkv.float() * w.input_norm.float() * row_scale
    bias = None if w.qkv_bias is None else (
        w.qkv_bias.float() * row_scale[:, 0]).to(w.qkv.dtype)
    gate_up = (w.gate_up.float() * w.post_norm.float()).to(w.gate_up.dtype)
    gate, up = ((pack(gate_up[:inter]), pack(gate_up[inter:])) if epilogues
                else (pack(gate_up), torch.empty(0, dtype=gate_up.dtype)))
    return FusedWeights(pack(qkv.to(w.qkv.dtype)), bias, pack(w.o_proj), gate, up,
                        pack(w.down), pool, slots)


class FusedLayer(_Layer):
    def __init__(self, config: ModelSpec, w: LayerWeights, pool: torch.Tensor,
                 slots: torch.Tensor, epilogues: bool = True) -> None:
        super().__init__(config, pool, slots)
        self.weights = fused_weights(config, w, pool, slots, epilogues)
        self.shape = layer_shape(config, epilogues)

    def bind_kv(self, pool: torch.Tensor, slots: torch.Tensor) -> None:
        super().bind_kv(pool, slots)
        self.weights = self.weights._replace(pool=pool, slots=slots)

    def forward(self, x: torch.Tensor, inputs: StepInputs, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        return fused_layer(x, cos, sin, self.weights, attention_plan(inputs, self.pool),
                           self.shape)


def run_layers(layers: Sequence[ExactLayer | FusedLayer], x: torch.Tensor,
               inputs: StepInputs, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Every layer in turn over the step's rows; fused layers in one scripted call."""
    if layers and all(isinstance(layer, FusedLayer) for layer in layers):
        fused = [layer for layer in layers if isinstance(layer, FusedLayer)]
        first = fused[0]
        return fused_stack(x, cos, sin, [layer.weights for layer in fused],
                           attention_plan(inputs, first.pool), first.shape)
    for layer in layers:
        x = layer.forward(x, inputs, cos, sin)
    return x


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
