"""Andes (QoE-aware token-level preemptive scheduling): the `andes` policy and parts."""

from andante.policies.andes.options import AndesOptions
from andante.policies.andes.policy import AndesPolicy

__all__ = ["AndesOptions", "AndesPolicy"]
