"""Built-in accelerators with datasheet rates and calibrated step-time coefficients.

Calibration (Ascendra §5.1 form, c1 folded into c3/c4 as `fit.py` does): with c2 = 1,
    memory-bound step   t ≈ tM / eM + (1/eF - 1)·tF + c5
    compute-bound step  t ≈ (1/eM - 1)·tM + tF / eF + c5
so c3 = 1/eM - 1 and c4 = 1/eF - 1, where eM and eF are the fractions of peak memory
bandwidth and peak FLOP/s a serving engine reaches, and c5 is the fixed per-step cost
(scheduling, sampling, kernel launches). The published figures they were fitted to
(reproduce with the predictions in tests/perf/test_published_figures.py):

[P1] vLLM 0.23, Llama-3.1-8B-Instruct BF16, one A100 40GB, 1024 in / 128 out,
     concurrency 1: decode ~75 tok/s = 13.3 ms/token ("roughly 77% of the memory-
     bandwidth ceiling"). J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100",
     https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on
[P2] NVIDIA NIM "Llama 3.1 Nemotron Safety Guard Multilingual 8B V1" (a Llama-3.1-8B),
     A100 80GB SXM, BF16, 500 in / 10 out, concurrency 1: TTFT 48.3 ms.
     https://docs.nvidia.com/nim/llama-3-1-nemotron-safety-guard-8b/1.10.1/performance
[P3] MInference (Jiang et al., NeurIPS 2024) Fig. 1(b), as corrected by the authors in
     https://github.com/microsoft/MInference/issues/84: Llama-3-8B, 300K-token prompt,
     one A100: about 3 minutes of prefill (attention-dominated).
[P4] NeMo Framework / TensorRT-LLM, Llama-2-7B, TP1, 128 in / 20 out, batch 1/2/4/8:
     A100 80GB SXM4 234.0/249.6/272.6/329.5 ms; H100 80GB HBM3 153.8/160.8/174.8/199.2 ms.
     https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/llama.html
[M1] A measurement on one NVIDIA H200 (2026-11-28, shared with this project; converted
     to a step log in benchmarks/data/h200-llama-3.1-8b-steps.jsonl, its method in
     benchmarks/data/README.md): a Llama-3.1-8B-shaped model, random BF16 weights, plain
     PyTorch with SDPA over a contiguous KV cache; decode steps (batch 1-256, context
     1,024-8,192) replayed as CUDA graphs, prefills (128-32,768 tokens) launched op by op.
Cross-checks (not fitted): vLLM PR #2192 (Llama-70B, 4x A100-80G, batch 64, 256 in /
256 out: 14.57 s); seeds: FastServe §6.1 (decode iteration ~30 ms, SLO 0.3 s = 10x, OPT
on A100-40GB), Ascendra §5.1 (A100-80G: 312 TFLOPS, 2 TB/s).
"""

from __future__ import annotations

import dataclasses

from andante.perf.specs import CostCoefficients, HardwareSpec

MiB = 1 << 20

# Ampere (A100, A10) under vLLM.
AMPERE_COEFFICIENTS = CostCoefficients(
    c1=0.0,  # tM+tF equals tM + tF: not identifiable apart from c3 and c4; folded in
    c2=1.0,  # the roofline max(tM, tF) itself
    # eM = 0.80: with c5 below, reproduces P1 exactly (model 13.3 ms vs 13.3 ms).
    c3=0.25,
    # eF = 0.50: P2 model 48.4 ms vs 48.3 ms; P3 model 178 s vs ~180 s.
    c4=1.0,
    # 1.1 ms per step: the part of P1 not explained by eM = 0.80 streaming 15.2 GB
    # (P1's own estimate is 77% of the ceiling including this overhead).
    c5=1.1e-3,
)

# Hopper (H100, H200): fitted to M1 (`andante calibrate --step-log` on its step log,
# H200 rates; tests/perf/test_h200_measurement.py refits and compares). Every step of
# M1 within 3.5%: prefills of 2,048-32,768 tokens run at 52-55% of the BF16 peak
# (c4 = 0.82), decode steps cost 4.9 ms (c5) plus the weights and KV cache streamed
# at close to the datasheet rate (c2 = 0.98, KV reads c6 = 0.12 more). Two prefills of
# M1 are not GPU work: 128 and 512 tokens both took 25 ms, the host's time to launch
# 32 layers op by op (the same decode steps launched op by op took 24-28 ms). A
# serving engine hides that (vLLM V1 replays prefills of up to 512 tokens as graphs and
# launches longer ones while the GPU runs), so `h200` leaves it out and `h200-torch`,
# the measured engine itself, keeps it (`eager_launch_per_layer`).
# Where the published figures disagree: M1 is plain PyTorch (no fused norm, RoPE or
# activation kernels, no paged attention), and its per-step cost of 4.9 ms is that of
# ~20 kernels per layer; a serving engine's fused kernels cost less (P1: 1.1 ms per step
# under vLLM on an A100). On P4 (TensorRT-LLM, H100, batch 1-8, held out) the model now
# sits 0.86-0.98x P4's latencies, where Ampere's sits 1.19-1.23x below P4 (its serving
# overhead): so for small decode batches these profiles are ~1.3x slower per step than
# a fused-kernel engine. They follow M1 because it is the one step-level Hopper
# measurement (the previous coefficients were extrapolated: prefill 1.37x slower than
# M1, batch-1 decode 0.65x of it at H200's bandwidth); an engine's own step log
# (`andante calibrate --step-log`) gives its own profile.
HOPPER_COEFFICIENTS = CostCoefficients(c1=0.0, c2=0.982, c3=0.0, c4=0.820, c5=4.89e-3,
                                       c6=0.122)
# M1's host launch floor: 25.1 ms for 32 layers (its 128- and 512-token prefills).
TORCH_EAGER_LAUNCH_PER_LAYER = 0.784e-3

# Host link: PCIe 4.0 x16 carries 31.5 GB/s per direction raw; pinned cudaMemcpy
# reaches ~25 GB/s (CUDA bandwidthTest). PCIe 5.0 x16 doubles that (~50 GB/s).
PCIE4_EFFECTIVE = 25e9
PCIE5_EFFECTIVE = 50e9
# Model weights from local disk (QLM §5 cold start: storage -> CPU memory -> GPU): a
# PCIe 4.0 x4 NVMe SSD reads sequentially at up to 7,450 MB/s (Samsung 990 PRO
# datasheet); 7 GB/s is that rounded down. A PCIe 5.0 x4 drive reads up to 14.5 GB/s
# (Samsung 9100 PRO datasheet); 12 GB/s. The host -> device copy of warm weights uses
# the host link above (pinned memory, cudaMemcpy: the same ~25 / ~50 GB/s).
NVME4_READ = 7.0e9
NVME5_READ = 12.0e9
# All-reduce bus bandwidth: ~80% of the per-direction NVLink rate (A100: NVLink3
# 600 GB/s both ways = 300 GB/s; H100: NVLink4 900 GB/s = 450 GB/s). A10 has no
# NVLink: peer traffic goes over PCIe 4.0.
NVLINK3_BUSBW = 240e9
NVLINK4_BUSBW = 360e9
PCIE4_BUSBW = 20e9
# One small all-reduce: ~6 us on HGX H100 with CUDA graphs (NCCL issue #1259,
# https://github.com/NVIDIA/nccl/issues/1259); 8 us allows for kernel boundaries.
NVLINK_COLLECTIVE_LATENCY = 8e-6
PCIE_COLLECTIVE_LATENCY = 25e-6

# NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense (1,979 with sparsity), 4.8 TB/s
# HBM3e, 141 GB (143771 MiB as nvidia-smi reports on M1's card), NVLink 900 GB/s, PCIe
# Gen5 (https://www.nvidia.com/en-us/data-center/h200/). The Hopper coefficients; no
# launch floor (a serving engine's view: see HOPPER_COEFFICIENTS).
H200 = HardwareSpec(name="h200", peak_flops=989e12, mem_bandwidth=4.8e12,
                    mem_capacity=143771 * MiB, host_link_bandwidth=PCIE5_EFFECTIVE,
                    interconnect_bandwidth=NVLINK4_BUSBW, coefficients=HOPPER_COEFFICIENTS,
                    collective_latency=NVLINK_COLLECTIVE_LATENCY, disk_bandwidth=NVME5_READ)

BUILTIN_HARDWARE: tuple[HardwareSpec, ...] = (
    # NVIDIA A10 datasheet: 125 TFLOPS BF16 dense tensor, 600 GB/s GDDR6, 24 GB
    # (23028 MiB usable with ECC, as nvidia-smi reports). No public measured step time
    # found: Ampere coefficients carried over from the A100 (same generation).
    HardwareSpec(name="a10-24g", peak_flops=125e12, mem_bandwidth=600e9,
                 mem_capacity=23028 * MiB, host_link_bandwidth=PCIE4_EFFECTIVE,
                 interconnect_bandwidth=PCIE4_BUSBW, coefficients=AMPERE_COEFFICIENTS,
                 collective_latency=PCIE_COLLECTIVE_LATENCY,
                 disk_bandwidth=NVME4_READ),
    # NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS BF16 dense, 1,555 GB/s HBM2.
    HardwareSpec(name="a100-40g", peak_flops=312e12, mem_bandwidth=1555e9,
                 mem_capacity=40960 * MiB, host_link_bandwidth=PCIE4_EFFECTIVE,
                 interconnect_bandwidth=NVLINK3_BUSBW, coefficients=AMPERE_COEFFICIENTS,
                 collective_latency=NVLINK_COLLECTIVE_LATENCY,
                 disk_bandwidth=NVME4_READ),
    # NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e.
    HardwareSpec(name="a100-80g", peak_flops=312e12, mem_bandwidth=2039e9,
                 mem_capacity=81920 * MiB, host_link_bandwidth=PCIE4_EFFECTIVE,
                 interconnect_bandwidth=NVLINK3_BUSBW, coefficients=AMPERE_COEFFICIENTS,
                 collective_latency=NVLINK_COLLECTIVE_LATENCY,
                 disk_bandwidth=NVME4_READ),
    # NVIDIA H100 datasheet (SXM5): 989 TFLOPS BF16 dense, 3.35 TB/s HBM3, 80 GB
    # (81559 MiB as nvidia-smi reports).
    HardwareSpec(name="h100-80g", peak_flops=989e12, mem_bandwidth=3350e9,
                 mem_capacity=81559 * MiB, host_link_bandwidth=PCIE5_EFFECTIVE,
                 interconnect_bandwidth=NVLINK4_BUSBW, coefficients=HOPPER_COEFFICIENTS,
                 collective_latency=NVLINK_COLLECTIVE_LATENCY,
                 disk_bandwidth=NVME5_READ),
    H200,
    # The same card under M1's own engine: plain PyTorch, decode replayed as CUDA
    # graphs, every step with prefill tokens launched op by op (at least 25 ms for an
    # 8B model): every step of M1 within 3.5% (tests/perf/test_h200_measurement.py).
    dataclasses.replace(H200, name="h200-torch",
                        eager_launch_per_layer=TORCH_EAGER_LAUNCH_PER_LAYER),
)
