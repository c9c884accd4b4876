"""Cluster layer: the controller, routers, load reports and the instance seam.

Pure logic: no threads, no clock. The same `Controller` drives simulated instances
(andante.sim), in-process engine threads (andante.runtime.local) and Ray actors
(andante.runtime.ray_actors, optional extra).
"""

from andante.cluster.controller import Controller, FailureOutcome, InstanceSlot
from andante.cluster.instance import Instance, UnsupportedOperation
from andante.cluster.load import LoadReport
from andante.cluster.registry import make_router, router_names
from andante.cluster.router import (
    LeastLoadedRouter,
    PowerOfTwoRouter,
    RoundRobinRouter,
    Router,
)

__all__ = [
    "Controller",
    "FailureOutcome",
    "Instance",
    "InstanceSlot",
    "LeastLoadedRouter",
    "LoadReport",
    "PowerOfTwoRouter",
    "RoundRobinRouter",
    "Router",
    "UnsupportedOperation",
    "make_router",
    "router_names",
]
