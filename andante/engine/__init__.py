"""The engine: its contract with policies (Policy, PolicyContext, StepPlan,
SchedulerConfig), the scheduler and the step loop. Assembly lives in `andante.llm`."""

from andante.engine.engine import Engine, StepOutput
from andante.engine.scheduler import RequestRejected, Scheduler

__all__ = ["Engine", "RequestRejected", "Scheduler", "StepOutput"]
