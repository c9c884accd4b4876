"""Discrete-event simulation of a GPU cluster running the real engine and scheduler."""

from andante.sim.run import SimRun, simulate
from andante.sim.setup import build_simulator
from andante.sim.simulator import SimInstance, SimReport, Simulator
from andante.sim.spec import ClusterSpec, InstanceSpec

__all__ = [
    "ClusterSpec",
    "InstanceSpec",
    "SimInstance",
    "SimReport",
    "SimRun",
    "Simulator",
    "build_simulator",
    "simulate",
]
