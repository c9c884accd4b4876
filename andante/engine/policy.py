"""The Policy contract: what a scheduling policy must answer to schedule a step.

Design note (DESIGN.md §2.4, policies are small registered objects; §3, the engine
loop). Once per engine step the `Scheduler` builds a `StepPlan` over its queues and the
block manager (the one owner of KV feasibility, §2.6) and calls `Policy.schedule(plan)`.
The policy may reorder `plan.waiting`, `plan.running` and `plan.swapped` in place
(never add or remove items) and records its decision through the plan: which requests
advance and by how many tokens (a whole prefill, a chunk of it, or a decode token: §2.3,
tokens, not phases), which running requests to preempt (recompute or swap) and which
swapped requests to bring back. It asks the plan, never the block manager directly,
what fits, and it does not mutate requests. Time comes from the injected clock
(`PolicyContext.clock`), costs from the executor's cost model: the same policy runs on
the real engine and in the simulator (§2.1). The hooks tell it about arrivals, finished
(or withdrawn) requests and completed steps; they must be cheap. A policy must make
progress: if any request can run alone, some step must schedule something.
`chunks_prefill` is True if it splits a prefill longer than the step's token budget
(else the budget must cover max_model_len; the scheduler checks it).

That is the whole contract: a policy implementing only `Policy` runs in the engine and,
unchanged, in the simulator, which then simulates every step. What lets the simulator
apply runs of steps at once is a separate, optional protocol
(`andante.engine.fast_path.SimFastPath`), for a policy that can vouch for its next
decisions.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from andante.core.clock import Clock
from andante.core.request import PreemptionMode, Request
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
    """A scheduling policy (see the module note for the contract)."""

    name: str
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
    chunks_prefill = False  # see Policy

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self.options = parse_options(self.Options, ctx.options, self.name)

    @classmethod
    def preemption_options(cls, mode: PreemptionMode) -> dict[str, Any]:
        """The options that make this policy preempt by `mode`; {} when it follows
        `SchedulerConfig.preemption_mode` (as the default does)."""
        return {}

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
    """Build `options_cls(**values)`, each value read as its field's declared type (text
    such as "2.5", "true" or "none" from a command line included); ValueError naming the
    policy, the option and the valid keys or the expected type."""
    valid = {f.name: f for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(
            f"policy {policy_name!r}: unknown option(s) {unknown}; valid: {sorted(valid)}"
        )
    hints = typing.get_type_hints(options_cls)
    typed = {}
    for key, value in values.items():
        try:
            typed[key] = _as_type(value, hints[key])
        except (TypeError, ValueError, KeyError):
            raise ValueError(f"policy {policy_name!r}: option {key}={value!r}: expected "
                             f"{_type_name(hints[key])}") from None
    return options_cls(**typed)


_NONE_TEXTS = ("none", "null")
_BOOL_TEXTS = {"true": True, "1": True, "yes": True, "on": True,
               "false": False, "0": False, "no": False, "off": False}


def _type_name(hint: Any) -> str:
    names = [getattr(a, "__name__", str(a)) for a in typing.get_args(hint) or (hint,)]
    return " or ".join("none" if name == "NoneType" else name for name in names)


def _as_type(value: Any, hint: Any) -> Any:
    """`value` as `hint` (bool, int, float, str, or one of them | None); other hints
    pass the value through unchanged."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_TEXTS):
            return None
        (hint,) = [a for a in args if a is not type(None)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        return _BOOL_TEXTS[str(value).strip().lower()]
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(value) if not isinstance(value, str) else int(value.strip())
    if hint is float:
        if isinstance(value, bool) or value is None:
            raise ValueError(value)
        return float(value)
    if hint is str:
        if value is None or isinstance(value, bool):
            raise ValueError(value)
        return str(value)
    return value
