"""Andes (QoE-aware token-level preemptive scheduling): the `andes` policy.

`gain.py` (what serving a request is worth), `solver.py` (the knapsack and the
refiner's bookkeeping), `options.py` (the tunables) and `policy.py` (the decision and
its execution) read in that order."""

from andante.policies.andes.policy import AndesOptions, AndesPolicy

__all__ = ["AndesOptions", "AndesPolicy"]
