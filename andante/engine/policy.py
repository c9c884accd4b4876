"""The Policy protocol: what a scheduling policy must do, and what it is given."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
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
    """A scheduling policy.

    Contract: `schedule(plan)` is called once per engine step. It may reorder
    `plan.waiting`, `plan.running` and `plan.swapped` in place (never add or remove
    items) and records its decision through the plan: which requests advance and by
    how many tokens, which running requests to preempt (recompute or swap) and which
    swapped requests to bring back. It must not mutate requests. The hooks tell it
    about arrivals, finished requests and completed steps; they must be cheap.
    A policy must make progress: if any request can run alone, some step must
    schedule something. `stationary` is True (it may change after each `schedule`) if
    its next decisions depend only on the queues' contents and the free blocks (not on
    time) until an arrival or a finish, so that the simulator may apply runs of
    identical all-decode steps at once (andante.sim.decode_run); such a run then calls
    `on_decode_run` with each step's duration instead of `on_step_end` per step, for a
    policy that keeps per-step state to replay it; `decode_run_reserve_blocks` device
    blocks must still be free at the end of such a run (a policy whose decision changes
    when free memory falls below a threshold; a prefill run's end too), and each step of
    a prefill run lasts at most `run_step_limit` seconds (math.inf: any; Andes while
    requests wait, so that its token-latency estimate stays below every reader's pace).
    `chunks_prefill` is True if it splits a prefill longer than the step's token budget
    (else the budget must cover max_model_len).
    A `prefill_run_budget` > 0 (the next steps' token budget) says that the policy's
    next steps, until an arrival or a finish, are certainly "every running request,
    each by its uncomputed tokens capped by the budget left, the decodes first" (while
    the budget is spent, whatever waits; with nothing waiting after that), so that
    the simulator may apply runs of chunked-prefill steps at once
    (andante.sim.prefill_run); such a run calls `on_prefill_run` instead of
    `on_step_end` per step. A policy whose chunks are not "the budget left" (Ascendra's
    LP instance caps them by predicted step time) gives them itself through
    `prefill_run_chunks` (None: the budget's).
    A `decode_budget` > 0 says that, with nothing waiting or swapped and every
    running request decoding, its step advances them all, in the order
    `decode_order(running, num_free_blocks)` gives (None if unsure), when they number
    at most that (andante.sim.after_finish).
    """

    name: str
    stationary: bool
    decode_run_reserve_blocks: int
    run_step_limit: float
    chunks_prefill: bool

    def schedule(self, plan: StepPlan) -> None: ...

    def on_arrival(self, req: Request) -> None: ...

    def on_finish(self, req: Request) -> None: ...

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None: ...

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None: ...

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None: ...

    @property
    def prefill_run_budget(self) -> int: ...

    def prefill_run_chunks(self, running: Sequence[Request],
                           others_wait: bool) -> list[int] | None: ...

    @property
    def decode_budget(self) -> int: ...

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> Sequence[Request] | None: ...


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
    decode_run_reserve_blocks = 0  # see Policy
    run_step_limit = math.inf  # see Policy
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

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """The steps of a decode run repeating `batch` took `durations` (their tokens
        are recorded and their requests' `num_computed_tokens` advanced)."""
        return None

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None:
        """The steps following `batch` prefilled `chunks` of its last request beside
        the others' decodes, lasted `durations` and ended at `times` (their tokens are
        recorded)."""
        return None

    @property
    def prefill_run_budget(self) -> int:
        """0: no chunked-prefill runs (see Policy)."""
        return 0

    def prefill_run_chunks(self, running: Sequence[Request],
                           others_wait: bool) -> list[int] | None:
        """The chunks of `running[-1]`'s prompt in the steps certain to follow, each
        beside a decode token of every other running request ([]: none is certain;
        `others_wait`: requests wait or are swapped); None: each chunk is the
        `prefill_run_budget` left (see Policy)."""
        return None

    @property
    def decode_budget(self) -> int:
        """0: no decode run starts without a scheduled step first (see Policy)."""
        return 0

    def decode_order(self, running: Sequence[Request],
                     num_free_blocks: int) -> Sequence[Request] | None:
        """The running list's own order (see Policy; `num_free_blocks`: free device
        blocks before the step)."""
        return running


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
