"""The Policy protocol: what a scheduling policy must do, and what it is given."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from andante.core.clock import Clock
from andante.core.request import Request
from andante.engine.config import SchedulerConfig
from andante.engine.plan import StepPlan
from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel


@dataclass(slots=True)
class PolicyContext:
    """What a policy may consult: the clock, the budgets and the executor's cost model."""

    clock: Clock
    config: SchedulerConfig
    cost_model: CostModel | None = None
    options: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    """A scheduling policy.

    Contract: `schedule(plan)` is called once per engine step. It may reorder
    `plan.waiting`, `plan.running` and `plan.swapped` in place (never add or remove
    items) and records its decision through the plan: which requests advance and by
    how many tokens, which running requests to preempt (recompute or swap) and which
    swapped requests to bring back. It must not mutate requests. The hooks tell it
    about arrivals, finished requests and completed steps; they must be cheap.
    A policy must make progress: if any request can run alone, some step must
    schedule something. `stationary` is True if its decisions depend only on the
    queues' contents and the free blocks (not on time) and it needs no `on_step_end`
    for all-decode steps: the simulator may then apply runs of identical decode steps
    at once (andante.sim.decode_run). `chunks_prefill` is True if it splits a prefill
    longer than the step's token budget (else the budget must cover max_model_len).
    """

    name: str
    stationary: bool
    chunks_prefill: bool

    def schedule(self, plan: StepPlan) -> None: ...

    def on_arrival(self, req: Request) -> None: ...

    def on_finish(self, req: Request) -> None: ...

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None: ...


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A policy without tunables."""


class BasePolicy:
    """Convenience base: stores the context, parses options, gives no-op hooks.

    A subclass declares its tunables as a frozen dataclass in `Options`; the values in
    `ctx.options` are checked against it (unknown names raise ValueError).
    """

    name = "base"
    Options: ClassVar[type] = NoOptions
    stationary = False  # see Policy
    chunks_prefill = False  # see Policy

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.options = parse_options(self.Options, ctx.options, self.name)

    @property
    def now(self) -> float:
        return self.ctx.clock.now()

    def schedule(self, plan: StepPlan) -> None:
        raise NotImplementedError

    def on_arrival(self, req: Request) -> None:
        return None

    def on_finish(self, req: Request) -> None:
        return None

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        return None


def parse_options(options_cls: type, values: dict[str, Any], policy_name: str) -> Any:
    """Build `options_cls(**values)`, naming the policy and the valid keys on error."""
    valid = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(
            f"policy {policy_name!r}: unknown option(s) {unknown}; valid: {sorted(valid)}"
        )
    return options_cls(**values)
