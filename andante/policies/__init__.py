"""Scheduling policies: small registered objects selected by name (DESIGN.md rule 4)."""

from andante.engine.config import SchedulerConfig
from andante.engine.plan import StepPlan
from andante.engine.policy import BasePolicy, Policy, PolicyContext
from andante.policies.registry import make_policy, policy_class, policy_names

__all__ = [
    "BasePolicy",
    "Policy",
    "PolicyContext",
    "SchedulerConfig",
    "StepPlan",
    "make_policy",
    "policy_class",
    "policy_names",
]
