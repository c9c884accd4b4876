"""`ascendra-hp`: Ascendra's high-priority (latency) instance.

Design note (Ascendra §6). The HP instance serves requests offloaded by LP instances
(already close to their TTFT deadline) and, when idle, the ones its ticket attracts
(§6.1; the ticket itself is the router's, `andante.cluster.ascendra`). It is
prefill-first and first-come-first-served: every step admits waiting prompts in arrival
order, up to `token_budget` prompt tokens (one longer prompt runs alone). Decodes ride
along in the same step (`mixed`, the default: measured better in both of the paper's
setups) or, as in vLLM v0 that the paper built on, only run in steps that admit
nothing. Elastic batch size (§6.2): instead of a fixed batch size it keeps admitting
beyond `base_batch` as long as GPU memory allows — more than `free_kv_share` of the KV
cache must stay free after reserving the expected decode growth of every running (and
just admitted) request, the expectation coming from the history of decode lengths (the
mean output of the requests it finished). The engine's own
max_num_seqs is the hard cap, so give HP instances a large one.
Its decisions depend on the queues, the free blocks and the finished requests' decode
lengths alone: it is `stationary` (the simulator's decode runs feed the performance
model through `on_decode_run`).
"""

from __future__ import annotations

from andante.core.request import Request
from andante.engine.plan import StepPlan
from andante.engine.policy import PolicyContext
from andante.metrics.stats import RunningMean
from andante.policies.ascendra.common import AscendraBase
from andante.policies.ascendra.options import HPOptions
from andante.policies.phases import (
    admit_in_order,
    by_arrival,
    prefill_first_step,
)


class AscendraHPPolicy(AscendraBase):
    name = "ascendra-hp"
    Options = HPOptions
    stationary = True

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.options: HPOptions
        self.decode_lengths = RunningMean(default=256.0)
        self._sorted = True

    def on_arrival(self, req: Request) -> None:
        self._sorted = False

    def on_finish(self, req: Request) -> None:
        if req.is_finished and req.num_output_tokens:
            self.decode_lengths.observe(req.num_output_tokens)

    @property
    def decode_budget(self) -> int:
        """With nothing waiting, every running request decodes, in order
        (andante.sim.after_finish)."""
        return self.ctx.config.max_num_batched_tokens

    def schedule(self, plan: StepPlan) -> None:
        if not self._sorted:
            plan.waiting.sort(key=by_arrival)
            self._sorted = True
        prefill_first_step(plan, self._admit, mixed=self.options.mixed)
        if plan.preemptions:
            self._sorted = False  # recomputed requests went to the front

    def decode_reserve_blocks(self, plan: StepPlan) -> int:
        """Blocks the running requests, and those admitted so far this step, are expected
        to need to finish decoding."""
        expected = self.decode_lengths.mean
        total = 0
        for req in [*plan.running, *plan.scheduled]:
            left = expected - req.num_output_tokens
            if left > 0:
                total += plan.num_blocks_for(int(left))
        return total

    def _admit(self, plan: StepPlan) -> None:
        opts = self.options
        tokens = 0
        reserve: int | None = None  # expected decode growth of running + admitted
        floor = opts.free_kv_share * plan.num_total_blocks
        per_request = plan.num_blocks_for(int(self.decode_lengths.mean))

        def accept(req: Request, n: int) -> bool:
            nonlocal tokens, reserve
            if tokens and tokens + n > opts.token_budget:
                return False
            if plan.num_active_seqs >= opts.base_batch:
                if not opts.elastic:
                    return False
                if reserve is None:
                    reserve = self.decode_reserve_blocks(plan)
                reserve += per_request
                if plan.num_free_blocks - plan.blocks_needed(req, n) - reserve < floor:
                    return False
            tokens += n
            return True

        admit_in_order(plan, plan.waiting, accept=accept)
