"""Andes (QoE-aware token-level preemptive scheduling): the `andes` policy.

`gain.py` (what serving a request is worth), `latency.py` (τ and the overheads),
`solver.py` (the knapsack and the refiner's bookkeeping), `options.py` (the tunables),
`refiner.py` (§4.3), `carry.py` (a decision through the step loops), `runs.py` (the
simulator's fast paths) and `policy.py` (the decision) read in that order."""

from andante.policies.andes.policy import AndesOptions, AndesPolicy

__all__ = ["AndesOptions", "AndesPolicy"]
