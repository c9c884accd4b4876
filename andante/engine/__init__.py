"""The engine: scheduler (queues, preemption, swap) and the step loop."""

from andante.engine.engine import Engine, StepOutput
from andante.engine.factory import build_engine
from andante.engine.scheduler import RequestRejected, Scheduler

__all__ = ["Engine", "RequestRejected", "Scheduler", "StepOutput", "build_engine"]
