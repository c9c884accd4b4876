"""The LP instance's chunked prefills as simulator runs (andante.sim.prefill_run).

Design note. While a prompt is prefilled in chunks beside decodes (Ascendra §5,
Algorithm 1: C caps each step's predicted time, so a long prompt takes several steps),
`AscendraLPPolicy.schedule` repeats itself until an arrival or a finish: every decode a
token, then the largest chunk of the prompt within C (the decodes' TBT share) and N
(the token budget), at least `min_chunk` or the rest of the prompt; then the waiting
requests, each refused while it does not fit C. `prefill_run_chunks` computes those
chunks ahead, step by step with the decodes one token longer each, so that the
simulator applies the steps at once instead of scheduling each; `on_prefill_run` then
feeds the performance model every step, as `on_step_end` would have.
The chunks are only computed where the result is certainly the steps' own:
- the performance model holds (no refit check before the last step: `steps_before_refit`)
  and its step time only grows with a chunk (no serial regime, no negative coefficient),
  so the chunk found is the one the step's search finds whatever caps its range;
- (the free blocks need no check here: the simulator keeps only the steps whose blocks
  are free, andante.sim.prefill_run, so KV never caps a step's range below its chunk);
- requests wait only if each, at every step, would be refused even its smallest allowed
  chunk (`min_chunk`, or its whole prompt) within C after the prompt's chunk (then none is
  admitted whatever their order), none is swapped, none may change its prefix-cache hit,
  and the run ends before the first of them falls at risk and is offloaded (§5.3:
  `prefill_run_until`, the first instant `at_risk` holds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from andante.core.request import Request
from andante.exec.batch import StepBatch
from andante.kv.prefix_cache import is_hashable
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.policies.ascendra.common import decode_shape, shape_with

if TYPE_CHECKING:
    from andante.engine.policy import PolicyContext
    from andante.policies.ascendra.options import LPOptions
    from andante.policies.ascendra.perf import OnlinePerfModel

MAX_WAITING = 16  # more waiting requests: the steps are scheduled one by one


def time_grows_with_tokens(model: CostModel) -> bool:
    """Is the model's step time non-decreasing in a chunk's tokens (and with sampling)?"""
    coefficients = model.coefficients
    return model.hardware.serial_below_tokens is None and coefficients.c6 >= 0 and all(
        c >= 0 for c in coefficients.as_tuple()[:4])


def first_at_risk(at_risk: Callable[[float], bool], estimate: float, now: float) -> float:
    """The first instant t >= now (a float) from which `at_risk(t)` holds, which only
    turns True as time passes; `estimate`: about there."""
    if not math.isfinite(estimate):
        return math.inf if estimate > 0 else now
    t = max(estimate, now)
    while not at_risk(t):
        t = math.nextafter(t, math.inf)
    while t > now and at_risk(math.nextafter(t, -math.inf)):
        t = math.nextafter(t, -math.inf)
    return t


class WaitingCheck:
    """Would every waiting request be refused beside a step's shape? (See the note.)"""

    def __init__(self, predict: Callable[[BatchShape], float], min_chunk: int,
                 waiting: Sequence[Request]) -> None:
        self.predict = predict
        self.smallest = [(r.num_computed_tokens, min(min_chunk, r.num_uncomputed_tokens),
                          r.num_uncomputed_tokens) for r in waiting]
        self.scratch = BatchShape()

    def __bool__(self) -> bool:
        return bool(self.smallest)

    def all_refused(self, shape: BatchShape, budget: float) -> bool:
        predict, scratch = self.predict, self.scratch
        return all(predict(shape_with(shape, n, cached, n == whole, scratch)) > budget
                   for cached, n, whole in self.smallest)


class PrefillRuns:
    """`AscendraLPPolicy`'s side of the simulator's prefill runs."""

    prefill_run_until = math.inf  # the last `prefill_run_chunks`' horizon

    if TYPE_CHECKING:  # the policy's state these hooks share (lp.py, common.py)
        ctx: PolicyContext
        options: LPOptions
        perf_model: OnlinePerfModel
        _handed: set[str]

        @property
        def now(self) -> float: ...

        @property
        def decode_budget(self) -> int: ...

        def _step_budget(self, decodes: list[Request]) -> float: ...

        def _fit_time(self, shape: BatchShape, cached: int, whole: int, limit: int,
                      budget: float, hint: int = 1) -> int: ...

        def note_chunk(self, request_id: str, n: int, last: bool) -> None: ...

        _last_chunk: dict[str, int]
        _recent_chunk: int

        def ttft_of(self, req: Request) -> float: ...

        def prefill_time(self, req: Request) -> float: ...

        def full_batch_time(self) -> float: ...

        def at_risk(self, req: Request, now: float) -> bool: ...

    @property
    def prefill_run_budget(self) -> int:
        """The step's token budget; the chunks come from `prefill_run_chunks`."""
        return self.decode_budget

    def prefill_run_chunks(self, running: Sequence[Request], waiting: Sequence[Request],
                           swapped: Sequence[Request]) -> list[int]:
        """The chunks of `running[-1]`'s prompt in the steps certain to follow ([]:
        none), the others decoding; see the module note."""
        self.prefill_run_until = math.inf
        *decodes, prefill = running
        token_limit = self.decode_budget - len(decodes)
        if swapped or token_limit < 1 or not time_grows_with_tokens(
                self.perf_model.cost_model):
            return []
        budget = self._step_budget(decodes) if decodes else math.inf
        check = self._waiting_check(waiting, budget)
        if check is None:
            return []
        shape = decode_shape(decodes)
        cached, left = prefill.num_computed_tokens, prefill.num_uncomputed_tokens
        min_chunk, scratch = self.options.min_chunk, BatchShape()
        chunks: list[int] = []
        steps = self.perf_model.steps_before_refit
        n = self._last_chunk.get(prefill.request_id, self._recent_chunk)
        while len(chunks) < steps:
            n = self._fit_time(shape, cached, left, min(left, token_limit), budget, n)
            if n != left and n < min(min_chunk, left):
                break  # (the step would not prefill)
            if check and not check.all_refused(
                    shape_with(shape, n, cached, n == left, scratch), budget):
                break
            chunks.append(n)
            cached += n
            left -= n
            if not left:
                break
            shape.advance_decodes()
        return chunks

    def _waiting_check(self, waiting: Sequence[Request],
                       budget: float) -> WaitingCheck | None:
        """What refuses the waiting requests (falsy: none wait; None: no run), and the
        run's horizon: the first instant one of them would be offloaded."""
        check = WaitingCheck(self.perf_model.predict, self.options.min_chunk, waiting)
        if not waiting:
            return check
        if len(waiting) > MAX_WAITING or budget == math.inf:
            return None
        if self.ctx.config.enable_prefix_caching and any(is_hashable(r) for r in waiting):
            return None  # a hit may change as the prompt's blocks are cached
        if self.options.offload:
            now = self.now
            self.prefill_run_until = min(
                (self._offload_time(r, now) for r in waiting if not r.output_token_ids
                 and not r.num_computed_tokens and r.request_id not in self._handed),
                default=math.inf)
        return check

    def _offload_time(self, req: Request, now: float) -> float:
        """When `req` falls at risk (§5.3), if it still waits then."""
        estimate = req.arrival_time + (self.ttft_of(req) - self.prefill_time(req)
                                       - self.full_batch_time())
        return first_at_risk(lambda t: self.at_risk(req, t), estimate, now)

    def on_prefill_run(self, batch: StepBatch, chunks: Sequence[int],
                       times: Sequence[float], durations: Sequence[float] = ()) -> None:
        """Feed the performance model each step of the run, as `on_step_end` would."""
        *decodes, prefill = batch.requests
        shape = decode_shape(decodes, steps_back=len(chunks))
        cached = prefill.num_computed_tokens - sum(chunks)
        token_times = prefill.timeline.token_times  # the prompt's first token: its last step
        sampled = bool(token_times) and token_times[-1] == times[-1]
        observe, last = self.perf_model.observe, len(chunks) - 1
        for step, (chunk, duration) in enumerate(zip(chunks, durations, strict=True)):
            one = shape.copy()
            one.add(chunk, cached, sampled and step == last)
            observe(one, duration)
            cached += chunk
            shape.advance_decodes()
        self.note_chunk(prefill.request_id, chunks[-1],
                        prefill.num_computed_tokens >= prefill.num_tokens - sampled)
