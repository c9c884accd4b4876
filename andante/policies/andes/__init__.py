"""Andes (QoE-aware token-level preemptive scheduling): the `andes` policy.

Four modules, read in this order: `policy.py` (the decision, one class, and the
simulator's fast paths), `qoe.py` (what serving a request is worth: the request
tracker's QoE state and the gain over Δt), `knapsack.py` (the decision's arrays, the
batch sizes and their token latency τ(B), the solvers) and `refiner.py` (§4.3: which
admission/preemption pairs are worth their cost); `options.py` holds the tunables."""

from andante.policies.andes.options import AndesOptions
from andante.policies.andes.policy import AndesPolicy

__all__ = ["AndesOptions", "AndesPolicy"]
