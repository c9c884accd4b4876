"""The cost model of the real engine: the calibrated `cpu` profile, or a rough default.

`andante calibrate` fits Ascendra's coefficients to measured steps and saves the
`cpu` hardware profile (andante.perf.save_hardware). Until then policies get
`DEFAULT_CPU`, datasheet-style guesses for a 2-core AVX-512 machine: ~150 GFLOP/s of
BF16 GEMM, ~12 GB/s of effective memory bandwidth, 3 ms fixed cost per step (Python
and dispatch), coefficients c2 = 1 (roofline) and nothing else. Expect errors of tens of
percent until calibrated.
"""

from __future__ import annotations

from andante.perf.catalog import get_hardware, hardware_names
from andante.perf.cost_model import CostModel
from andante.perf.specs import CostCoefficients, HardwareSpec, ModelSpec

GIB = 1 << 30
CPU_PROFILE = "cpu"

DEFAULT_CPU = HardwareSpec(
    name=CPU_PROFILE, peak_flops=150e9, mem_bandwidth=12e9, mem_capacity=16 * GIB,
    host_link_bandwidth=8e9, interconnect_bandwidth=8e9,
    coefficients=CostCoefficients(c1=0.0, c2=1.0, c3=0.0, c4=0.0, c5=3e-3),
    collective_latency=0.0,
)


def cpu_hardware(name: str = CPU_PROFILE) -> tuple[HardwareSpec, bool]:
    """(the saved profile `name`, True), or (DEFAULT_CPU, False) when none is saved.

    A saved but unreadable profile raises ValueError naming its file."""
    if name in hardware_names():
        return get_hardware(name), True
    return DEFAULT_CPU, False


def engine_cost_model(spec: ModelSpec, hardware: str = CPU_PROFILE) -> CostModel:
    return CostModel(spec, cpu_hardware(hardware)[0])
