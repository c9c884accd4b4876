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
- nothing waits or is swapped (with requests waiting, each step may admit or offload
  one; runs there were measured to save nothing);
- the performance model holds (no refit check before the last step: `steps_before_refit`)
  and its step time only grows with a chunk (no serial regime, no negative coefficient,
  no prefill or decode size factors: a factor table need not grow with its class),
  so the chunk found is the one the step's search finds whatever caps its range (the
  free blocks need no check: the simulator keeps only the steps whose blocks are free,
  andante.sim.prefill_run, so KV never caps a step's range below its chunk).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from andante.core.request import Request
from andante.exec.batch import StepBatch
from andante.perf.cost_model import CostModel
from andante.perf.shape import BatchShape
from andante.policies.ascendra.common import decode_shape

if TYPE_CHECKING:
    from andante.engine.policy import PolicyContext
    from andante.policies.ascendra.options import LPOptions
    from andante.policies.ascendra.perf import OnlinePerfModel


def time_grows_with_tokens(model: CostModel) -> bool:
    """Is the model's step time non-decreasing in a chunk's tokens (and with sampling)?
    Not with size factors: a table may fall from one class to the next (and a chunk's
    first token swaps the decodes' factor for the prefill's; andante.perf.cost_model)."""
    hardware, coefficients = model.hardware, model.coefficients
    if hardware.prefill_factors or hardware.decode_factors:
        return False
    return hardware.serial_below_tokens is None and coefficients.c6 >= 0 and all(
        c >= 0 for c in coefficients.as_tuple()[:4])


class PrefillRuns:
    """`AscendraLPPolicy`'s side of the simulator's prefill runs."""

    if TYPE_CHECKING:  # the policy's state these hooks share (lp.py, common.py)
        ctx: PolicyContext
        options: LPOptions
        perf_model: OnlinePerfModel

        @property
        def decode_budget(self) -> int: ...

        def _step_budget(self, decodes: list[Request]) -> float: ...

        def _fit_time(self, shape: BatchShape, cached: int, whole: int, limit: int,
                      budget: float, hint: int = 1) -> int: ...

        def note_chunk(self, request_id: str, n: int, last: bool) -> None: ...

        def _time_grows(self) -> bool: ...

        _last_chunk: dict[str, int]
        _recent_chunk: int


    @property
    def prefill_run_budget(self) -> int:
        """The step's token budget; the chunks come from `prefill_run_chunks`."""
        return self.decode_budget

    def prefill_run_chunks(self, running: Sequence[Request],
                           others_wait: bool) -> list[int]:
        """The chunks of `running[-1]`'s prompt in the steps certain to follow ([]:
        none), the others decoding; see the module note."""
        *decodes, prefill = running
        token_limit = self.decode_budget - len(decodes)
        if others_wait or token_limit < 1 or not self._time_grows():
            return []
        budget = self._step_budget(decodes) if decodes else math.inf
        shape = decode_shape(decodes)
        cached, left = prefill.num_computed_tokens, prefill.num_uncomputed_tokens
        min_chunk = self.options.min_chunk
        chunks: list[int] = []
        steps = self.perf_model.steps_before_refit
        n = self._last_chunk.get(prefill.request_id, self._recent_chunk)
        while len(chunks) < steps:
            n = self._fit_time(shape, cached, left, min(left, token_limit), budget, n)
            if n != left and n < min(min_chunk, left):
                break  # (the step would not prefill)
            chunks.append(n)
            cached += n
            left -= n
            if not left:
                break
            shape.advance_decodes()
        return chunks

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
