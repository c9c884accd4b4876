"""Scheduling policies: small registered objects selected by name (DESIGN.md rule 4)."""

from andante.policies.base import BasePolicy, Policy, PolicyContext
from andante.policies.config import SchedulerConfig
from andante.policies.plan import StepPlan
from andante.policies.registry import make_policy, policy_names

__all__ = [
    "BasePolicy",
    "Policy",
    "PolicyContext",
    "SchedulerConfig",
    "StepPlan",
    "make_policy",
    "policy_names",
]
