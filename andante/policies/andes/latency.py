"""Token latency τ(B), prefill and swap costs, refined online from observed steps.

Design note (Andes Appendix B, §4.3 "Overhead Estimation"). Batch size and total
context are nearly perfectly correlated, so the token generation latency is modelled
as a function of B alone: τ(B) = ρ · decode_time(B, c̄), with c̄ the running mean
context of decoded requests and decode_time from the executor's cost model. ρ is
learned online: after each step that decodes, the observed inter-token time of the
decoded requests (from the end of the previous decoding step, so prefill steps in
between count, as they do for the reader) is divided by the prediction, and an EMA
of that ratio is kept. Overheads come from the same cost model: recompute = a
prefill of prompt + generated tokens (interpolated from a table), swap = KV bytes
over the host link. Without a cost model (tests) τ is the observed step time alone.
"""

from __future__ import annotations

import numpy as np

from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch, StepResult
from andante.perf.cost_model import CostModel

FALLBACK_TOKEN_LATENCY = 0.02  # s, Andes' public code before any observation
FALLBACK_PREFILL_PER_TOKEN = 1e-4  # s
FALLBACK_SWAP_PER_TOKEN = 1e-5  # s
PREFILL_GRID = 64  # tokens between prefill-table points
CONTEXT_BUCKET = 64  # tokens; τ tables are cached per bucket of mean context
RATIO_BOUNDS = (0.25, 50.0)


class LatencyModel:
    def __init__(self, cost_model: CostModel | None, config: SchedulerConfig,
                 ema: float = 0.1) -> None:
        self.cost_model = cost_model
        self.max_batch = config.max_num_seqs
        self.ema = ema
        self._init_tables(config)
        self.ratio = 1.0  # observed / predicted token latency
        self.token_latency = FALLBACK_TOKEN_LATENCY  # observed inter-token time (EMA)
        self.mean_context = 512.0
        self._last_decode_end: float | None = None
        self._last_step_end: float | None = None

    def _init_tables(self, config: SchedulerConfig) -> None:
        self._tau_cache: dict[int, np.ndarray] = {}
        grid = np.arange(0, config.max_model_len + PREFILL_GRID, PREFILL_GRID, dtype=float)
        self._prefill_grid = grid
        cm = self.cost_model
        if cm is None:
            self._prefill_table = grid * FALLBACK_PREFILL_PER_TOKEN
            self._swap_per_token = FALLBACK_SWAP_PER_TOKEN
            return
        self._prefill_table = np.array([cm.prefill_time(int(x)) for x in grid])
        self._swap_per_token = cm.swap_time(1)

    # ---- predictions ----------------------------------------------------------------
    def _decode_table(self) -> np.ndarray:
        """decode_time(B, c̄) for B = 0..max_batch (cached per context bucket)."""
        bucket = int(self.mean_context // CONTEXT_BUCKET)
        table = self._tau_cache.get(bucket)
        if table is None:
            ctx = bucket * CONTEXT_BUCKET + CONTEXT_BUCKET // 2
            cm = self.cost_model
            assert cm is not None
            table = np.array([cm.decode_time(b, ctx) for b in range(self.max_batch + 1)])
            self._tau_cache[bucket] = table
        return table

    def tau(self, batch: np.ndarray | int) -> np.ndarray:
        """Predicted seconds per token for each request of a batch of size B."""
        b = np.clip(np.asarray(batch), 1, self.max_batch)
        if self.cost_model is None:
            return np.full(b.shape, self.token_latency)
        return self.ratio * self._decode_table()[b]

    def prefill_time(self, tokens: np.ndarray) -> np.ndarray:
        return np.interp(tokens, self._prefill_grid, self._prefill_table)

    def swap_time(self, tokens: np.ndarray) -> np.ndarray:
        """One-way copy of `tokens` tokens of KV between device and host."""
        return np.asarray(tokens, dtype=float) * self._swap_per_token

    def fastest_batch_within(self, seconds: float) -> int:
        """The largest B whose predicted τ(B) <= seconds (0 if none)."""
        if self.cost_model is None:
            return self.max_batch if self.token_latency <= seconds else 0
        table = self.ratio * self._decode_table()
        return int(np.searchsorted(table[1:], seconds, side="right"))

    # ---- online refinement ----------------------------------------------------------
    def observe(self, batch: StepBatch, result: StepResult, now: float) -> None:
        """Fold one completed step into the estimates (cheap: one pass over the batch)."""
        started = now - result.duration
        if self._last_step_end is None or started > self._last_step_end + 1e-9:
            self._last_decode_end = None  # the engine idled: no inter-token time to learn
        self._last_step_end = now
        num_dec = 0
        context = 0
        for new, cached in zip(batch.num_new_tokens, batch.num_cached_tokens, strict=True):
            if new == 1 and cached > 0:
                num_dec += 1
                context += cached
        if num_dec == 0:
            return
        a = self.ema
        self.mean_context += a * (context / num_dec - self.mean_context)
        last, self._last_decode_end = self._last_decode_end, now
        if last is None or now <= last:
            return
        gap = now - last
        self.token_latency += a * (gap - self.token_latency)
        if self.cost_model is not None:
            predicted = float(self._decode_table()[min(num_dec, self.max_batch)])
            observed = float(np.clip(gap / predicted, *RATIO_BOUNDS))
            self.ratio += a * (observed - self.ratio)
