"""Ascendra (Ikram, Li et al., 2025): low- and high-priority instance pools.

`ascendra-lp` (out-of-order batching, offload of at-risk requests) and `ascendra-hp`
(prefill-first FCFS, elastic batch) are the instance policies; the router that sends
requests to the pools, with the HP ticket, is `andante.cluster.ascendra`.
"""

from andante.policies.ascendra.hp import AscendraHPPolicy
from andante.policies.ascendra.lp import AscendraLPPolicy
from andante.policies.ascendra.perf import OnlinePerfModel
from andante.policies.ascendra.values import VALUE_FUNCTIONS, value_function

__all__ = [
    "VALUE_FUNCTIONS",
    "AscendraHPPolicy",
    "AscendraLPPolicy",
    "OnlinePerfModel",
    "value_function",
]
