"""Links between instances: what activations, KV blocks and reloaded weights cross.

KunServe's pipeline groups span instances (one or more servers each), so a stage's
hidden states, the KV exchange (§4.2) and the weight reload of a restore (§4.4) travel
over the inter-instance link, not over the GPUs' own interconnect. Figures:
[K2] KunServe Table 2: cluster A, one A800 per server, 200 Gbps RDMA between servers;
     cluster B, 8 H800 per server over 300 GB/s NVLink, 400 Gbps RDMA between servers
     (unidirectional). A link is used at its line rate (large RDMA writes reach it).
[P] PCIe 4.0 x16 peer copies through the host: ~25 GB/s (as `hardware.PCIE4_EFFECTIVE`).
Per-message latency: an assumed 10 us for a network hop (NIC, switch and the sender's
software), 5 us within a server; a stage hop pays it once per microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One direction of an inter-instance link (B/s, seconds)."""

    name: str
    bandwidth: float
    latency: float = 10e-6

    def __post_init__(self) -> None:
        if self.bandwidth <= 0 or self.latency < 0:
            raise ValueError(f"link {self.name!r}: bandwidth must be > 0 and latency >= 0")

    def transfer_time(self, num_bytes: float) -> float:
        return self.latency + num_bytes / self.bandwidth if num_bytes > 0 else 0.0


BUILTIN_LINKS: tuple[LinkSpec, ...] = (
    LinkSpec("rdma-200g", bandwidth=200e9 / 8),  # [K2] cluster A
    LinkSpec("rdma-400g", bandwidth=400e9 / 8),  # [K2] cluster B, across servers
    LinkSpec("nvlink-300", bandwidth=300e9, latency=5e-6),  # [K2] cluster B, in a server
    LinkSpec("pcie4", bandwidth=25e9, latency=5e-6),  # [P]
)


def link_names() -> list[str]:
    return [link.name for link in BUILTIN_LINKS]


def get_link(name: str) -> LinkSpec:
    for link in BUILTIN_LINKS:
        if link.name == name:
            return link
    raise ValueError(f"unknown link {name!r}; valid names: {', '.join(link_names())}")
