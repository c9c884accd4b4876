"""Discrete-event simulation of a GPU cluster running the real engine and scheduler."""

from andante.sim.run import SimRun, simulate
from andante.sim.setup import ClusterSpec, build_simulator
from andante.sim.simulator import SimInstance, SimReport, Simulator

__all__ = [
    "ClusterSpec",
    "SimInstance",
    "SimReport",
    "SimRun",
    "Simulator",
    "build_simulator",
    "simulate",
]
