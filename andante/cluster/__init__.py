"""Cluster layer: routers and (later) the controller over many instances."""

from andante.cluster.router import LoadReport, RoundRobinRouter, Router

__all__ = ["LoadReport", "RoundRobinRouter", "Router"]
