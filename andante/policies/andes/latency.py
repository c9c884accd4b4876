"""The token-latency model: τ(B), recompute and swap times (Andes Appendix B, §4.3).

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

import math
from bisect import bisect_right
from typing import overload

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
        self._point_cache: dict[tuple[int, int], float] = {}  # (bucket, B) -> decode time
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

    def _decode_time_at(self, batch: int) -> float:
        """`_decode_table()[batch]`, without building the whole table for a new context
        bucket (the online refinement reads one batch size per step)."""
        bucket = int(self.mean_context // CONTEXT_BUCKET)
        table = self._tau_cache.get(bucket)
        if table is not None:
            return float(table[batch])
        key = (bucket, batch)
        value = self._point_cache.get(key)
        if value is None:
            cm = self.cost_model
            assert cm is not None
            value = float(cm.decode_time(batch, bucket * CONTEXT_BUCKET + CONTEXT_BUCKET // 2))
            self._point_cache[key] = value
        return value

    @overload
    def tau(self, batch: int) -> float: ...

    @overload
    def tau(self, batch: np.ndarray) -> np.ndarray: ...

    def tau(self, batch: np.ndarray | int) -> np.ndarray | float:
        """Predicted seconds per token for each request of a batch of size B."""
        if isinstance(batch, int) and self.cost_model is not None:  # (no array overhead,
            # nor a whole table for a new context bucket: one point of it)
            return self.ratio * self._decode_time_at(min(max(batch, 1), self.max_batch))
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
        cached_tokens = batch.num_cached_tokens
        if batch.num_tokens == len(cached_tokens) and min(cached_tokens, default=0) > 0:
            num_dec, context = len(cached_tokens), sum(cached_tokens)  # all decodes
        else:
            num_dec = context = 0
            for new, cached in zip(batch.num_new_tokens, cached_tokens, strict=True):
                if new == 1 and cached > 0:
                    num_dec += 1
                    context += cached
        self.observe_decodes(num_dec, context, now)

    def observe_decodes(self, num_dec: int, context: int, now: float) -> None:
        """A step that ended at `now` decoded `num_dec` requests holding `context`
        tokens in all (what `observe` reads off a batch)."""
        self._last_step_end = now
        if num_dec:
            self._fold_decode(num_dec, context, now)

    def idle(self) -> None:
        """Nothing runs: the next decode's gap since the last one is no inter-token time.
        (Not inferred from gaps between steps: a real engine's loop spends time between
        steps, and readers wait through it too.)"""
        self._last_decode_end = None

    def run_times(self, token_times: list[float]) -> list[float]:
        """The times in `token_times` (a decoded request's) after the last observed
        step: the steps of a simulator decode run that no `observe` saw."""
        if self._last_step_end is None:
            return []
        return token_times[bisect_right(token_times, self._last_step_end):]

    def observe_run(self, times: list[float], num_dec: int, context: int) -> list[float]:
        """Fold a decode run (len(times) steps of `num_dec` decodes holding `context`
        tokens in its first step and one more per request in each next one, ending at
        `times`) into the estimates, as `observe` once per step would; returns the
        token latency before each step."""
        context -= num_dec  # (the context of a step before the run)
        if self.cost_model is None or self._last_decode_end is None:
            before = []
            for j, now in enumerate(times, start=1):
                before.append(self.token_latency)
                self._fold_decode(num_dec, context + j * num_dec, now)
        else:
            before = self._fold_run(num_dec, context, times)
        if times:
            self._last_step_end = times[-1]
        return before

    def _fold_run(self, num_dec: int, context: int, times: list[float]) -> list[float]:
        """`_fold_decode` for each of `times` (the same arithmetic, in locals: a decode
        run can stand for hundreds of steps)."""
        a, low, high = self.ema, *RATIO_BOUNDS
        mean, latency, ratio = self.mean_context, self.token_latency, self.ratio
        last = self._last_decode_end
        assert last is not None
        b = min(num_dec, self.max_batch)
        before = []
        # the bucket's mean-context range [floor, ceiling) keeps its predicted τ(b)
        floor, ceiling, predicted = math.inf, -math.inf, 0.0
        for j, now in enumerate(times, start=1):
            before.append(latency)
            mean += a * ((context + j * num_dec) / num_dec - mean)
            if now > last:
                gap = now - last
                latency += a * (gap - latency)
                if not floor <= mean < ceiling:
                    self.mean_context = mean
                    bucket = mean // CONTEXT_BUCKET
                    floor, ceiling = bucket * CONTEXT_BUCKET, (bucket + 1) * CONTEXT_BUCKET
                    predicted = self._decode_time_at(b)
                observed = gap / predicted
                observed = low if observed < low else high if observed > high else observed
                ratio += a * (observed - ratio)
            last = now
        self.mean_context, self.token_latency, self.ratio = mean, latency, ratio
        self._last_decode_end = last
        return before

    def _fold_decode(self, num_dec: int, context: int, now: float) -> None:
        a = self.ema
        self.mean_context += a * (context / num_dec - self.mean_context)
        last, self._last_decode_end = self._last_decode_end, now
        if last is None or now <= last:
            return
        gap = now - last
        self.token_latency += a * (gap - self.token_latency)
        if self.cost_model is not None:
            predicted = self._decode_time_at(min(num_dec, self.max_batch))
            low, high = RATIO_BOUNDS  # np.clip's value, without its per-call overhead
            observed = min(max(gap / predicted, low), high)
            self.ratio += a * (observed - self.ratio)
