"""Routers by name, and all that code outside a router needs to know of it.

Adding a router = one module plus one entry here (imported on demand). The entry says,
besides the router's class, what assembling a cluster around it takes, so that no code
branches on a router's name (DESIGN.md §2 rule 4, as the policies' registry):
- `pool_plan`: the router splits the instances into pools, each with its own policy
  and role (Ascendra's LP and HP pools); its pools' policies replace `--policy`;
- `several_models`: whether it may serve several models on one server;
- `swaps_models`: it decides model swaps (QLM's LSO 5): a fleet's upstreams sharing a
  device need it;
- `preemption`: builds, from an instance's cost model, the function choosing each
  preempted request's mode (QLM's Insight #2, eviction or state swap by cost) when a
  cluster asks for it;
- `engine_policy`: the engine policy its instances need (QLM: `qlm-edf`, its agents
  evict); a cluster behind it runs that policy, and a server refuses another;
- `in_process`: its cluster operations need in-process instances (KunServe's groups);
- `simulator`: the function building its own simulated cluster (its instances and
  operators); `serve_operators`: the one building its cluster operators in a server.

Hooks are "package.module:name" strings. The last two name modules of the layers that
use them (andante.sim, andante.runtime), imported by those layers on demand: this module
imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from andante.cluster.router import Router
from andante.core.imports import load_attr, load_class


@dataclass(frozen=True, slots=True)
class PoolMember:
    """What one instance of a cluster runs: its role (what its router calls it), its
    policy (with its options) and the factor on the cluster's `max_num_seqs` (a
    `pool_plan` hook returns one per instance)."""

    role: str
    policy: str
    policy_options: dict[str, Any]
    batch_factor: int = 1


@dataclass(frozen=True, slots=True)
class RouterEntry:
    router: str  # the router's class
    pool_plan: str | None = None
    several_models: bool = True
    preemption: str | None = None
    engine_policy: str | None = None
    in_process: bool = False
    simulator: str | None = None
    serve_operators: str | None = None
    reads_prompt_tokens: bool = False  # places by prompt token blocks (not on upstreams)
    swaps_models: bool = False

    def hook(self, name: str) -> Any:
        """The function the hook `name` names (None: the router has no such hook)."""
        target = getattr(self, name)
        return None if target is None else load_attr(target)


ROUTERS = MappingProxyType({
    "round-robin": RouterEntry("andante.cluster.router:RoundRobinRouter"),
    "least-loaded": RouterEntry("andante.cluster.router:LeastLoadedRouter"),
    "power-of-two": RouterEntry("andante.cluster.router:PowerOfTwoRouter"),
    "cache-aware": RouterEntry("andante.cluster.cache_aware:CacheAwareRouter",
                               reads_prompt_tokens=True),
    "ascendra": RouterEntry("andante.cluster.ascendra:AscendraRouter",
                            pool_plan="andante.cluster.ascendra:pool_plan",
                            several_models=False),
    "qlm": RouterEntry("andante.cluster.qlm.router:QLMRouter",
                       preemption="andante.cluster.qlm.eviction:preemption_chooser",
                       engine_policy="qlm-edf", swaps_models=True),
    "shepherd": RouterEntry("andante.cluster.shepherd:ShepherdRouter"),
    "kunserve": RouterEntry(
        "andante.cluster.kunserve.router:KunServeRouter", in_process=True,
        simulator="andante.sim.kunserve:build_kunserve_simulator",
        serve_operators="andante.runtime.kunserve:serve_operators"),
    "llumnix": RouterEntry("andante.cluster.llumnix:LlumnixRouter",
                           simulator="andante.sim.llumnix:build_llumnix_simulator"),
})
PLAIN = RouterEntry("")  # a router given as "module:Class": no hooks


def engine_policy_for(router: str, policy: str | None) -> str | None:
    """The engine policy to run behind `router`: the one it needs (its entry's
    `engine_policy`), else `policy`; ValueError in one line when `policy` (asked for
    explicitly) is another."""
    needed = router_entry(router).engine_policy
    if needed is None or policy in (None, needed):
        return needed or policy
    raise ValueError(f"--router {router} needs --policy {needed} (its agents evict and "
                     f"swap out running requests themselves); drop --policy {policy}")


def router_names() -> list[str]:
    return sorted(ROUTERS)


def router_entry(name: str) -> RouterEntry:
    """The entry of router `name` (a "module:Class" path or an unregistered router's
    own name: an entry without hooks)."""
    return ROUTERS.get(name, PLAIN)


def make_router(name: str, options: dict[str, Any] | None = None) -> Router:
    """The router registered as `name` (or a "module:Class" path), with its options."""
    entry = ROUTERS.get(name)
    target = entry.router if entry is not None else (name if ":" in name else None)
    if target is None:
        raise ValueError(f"unknown router {name!r}; choose one of {', '.join(router_names())}")
    router: Router = load_class(target)(**dict(options or {}))
    return router
