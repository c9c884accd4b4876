"""Policies by name. Adding a policy = one module plus one line here.

Names map to "module:Class" strings and are imported on demand, so the registry is an
immutable table rather than mutable state filled by import side effects. A name of the
form "package.module:Class" loads a policy from outside andante.
"""

from __future__ import annotations

from types import MappingProxyType

from andante.core.imports import load_class
from andante.engine.policy import Policy, PolicyContext

POLICIES = MappingProxyType(
    {
        "vllm": "andante.policies.vllm:VLLMPolicy",
        "vllm-v0": "andante.policies.vllm_v0:VLLMV0Policy",
        "sarathi": "andante.policies.vllm:SarathiPolicy",
        "priority": "andante.policies.priority:PriorityPolicy",
        "edf": "andante.policies.edf:EDFPolicy",
        "qlm-edf": "andante.policies.qlm_edf:QLMEDFPolicy",
        "sjf": "andante.policies.sjf:SJFPolicy",
        "static-batch": "andante.policies.static_batch:StaticBatchPolicy",
        "andes": "andante.policies.andes:AndesPolicy",
        "lqsf": "andante.policies.lqsf:LQSFPolicy",
        "fastserve": "andante.policies.fastserve:FastServePolicy",
        "fastserve-fcfs": "andante.policies.fastserve:FastServeFCFSPolicy",
        "ascendra-lp": "andante.policies.ascendra:AscendraLPPolicy",
        "ascendra-hp": "andante.policies.ascendra:AscendraHPPolicy",
    }
)


def policy_names() -> list[str]:
    return sorted(POLICIES)


def policy_class(name: str) -> type:
    """The class registered as `name` (or a "module:Class" path); ValueError if unknown."""
    target = POLICIES.get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(policy_names())}")
    cls: type = load_class(target)
    return cls


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    """Instantiate the policy registered as `name` (or a "module:Class" path)."""
    policy: Policy = policy_class(name)(ctx)
    return policy
