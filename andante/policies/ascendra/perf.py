"""Ascendra's performance model, refitted online from the instance's own steps.

Design note (Ascendra §5.1): a step's latency is regressed on the analytic memory and
compute times of its batch, t = C1(tM+tF) + C2·max(tM,tF) + C3·tM + C4·tF + C5 — the
form of `andante.perf.CostModel`, whose coefficients start from the hardware profile.
"The system keeps collecting data from incoming requests and periodically updates the
model": every step's (batch shape, measured duration) is kept in a sliding window and
every `refit_every` steps the coefficients are refitted by non-negative least squares
(`andante.perf.fit`) — after the first fit, only while the recent error exceeds
`tolerance` (a good model is left alone). Before each step is recorded, the current
model's prediction is scored against it; `error` is the mean absolute relative error
over the recent steps — the figure the paper reports (< 10% after five minutes of
data). In the simulator the "measured" durations come from the same form, so the fit
recovers the coefficients and the error is ~0; on the real engine the refit corrects
the uncalibrated CPU profile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from andante.perf.cost_model import CostModel
from andante.perf.fit import Sample, fit_coefficients
from andante.perf.shape import BatchShape
from andante.policies.ascendra.samples import SampleWindow


class OnlinePerfModel:
    """`predict(shape)` / `prefill_time(n)` from the latest fit; `observe` each step."""

    def __init__(self, base: CostModel, window: int = 512, refit_every: int = 256,
                 min_samples: int = 32, error_window: int = 256,
                 tolerance: float = 0.03) -> None:
        if window < 1 or refit_every < 0 or min_samples < 1 or error_window < 1:
            raise ValueError(f"bad refit settings: window={window}, refit_every={refit_every},"
                             f" min_samples={min_samples}, error_window={error_window}")
        self.base = base
        self.cost_model = base
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.tolerance = tolerance  # no refit while the recent error stays below it
        self.version = 0  # bumped by every refit: cached predictions are stale
        self.num_fits = 0
        self._samples = SampleWindow(window)
        self._errors: deque[float] = deque(maxlen=error_window)
        self._error_sum = 0.0
        self._since_fit = 0

    @property
    def error(self) -> float | None:
        """Mean absolute relative prediction error over the recent steps (None: none yet)."""
        return self._error_sum / len(self._errors) if self._errors else None

    @property
    def steps_before_refit(self) -> float:
        """Steps `observe` records before one may refit (the model holds until then);
        inf without refits."""
        return self.refit_every - self._since_fit if self.refit_every else math.inf

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def predict(self, shape: BatchShape) -> float:
        return self.cost_model.step_time(shape)

    def prefill_time(self, num_tokens: int, num_cached: int = 0) -> float:
        return self.cost_model.prefill_time(num_tokens, num_cached)

    def observe(self, shape: BatchShape, duration: float) -> None:
        """Record one step (its compute time, swaps excluded); refit when due."""
        if shape.num_tokens <= 0 or not duration > 0:
            return
        error = abs(self.cost_model.step_time(shape) - duration) / duration
        if len(self._errors) == self._errors.maxlen:
            self._error_sum -= self._errors[0]
        self._errors.append(error)
        self._error_sum += error
        self._samples.append((shape, duration))
        self._since_fit += 1
        if self.refit_every and self._since_fit >= self.refit_every and self._drifted():
            self.refit()
        elif self._since_fit >= self.refit_every:
            self._since_fit = 0

    def observe_decode_run(self, shape: BatchShape, durations: Sequence[float]) -> None:
        """`observe` each step of a decode run: `shape` and the steps after it, every
        sequence one token longer per step (`BatchShape.advance_decodes`), lasting
        `durations`. The same records, errors and refits as step by step; the predictions
        between two refit checks come from `CostModel.decode_step_times` at once."""
        if shape.num_tokens <= 0 or not all(d > 0 for d in durations):
            for duration in durations:  # observe's own skips
                self.observe(shape.copy(), duration)
                shape.advance_decodes()
            return
        done, seqs = 0, shape.num_seqs
        samples = self._samples
        while done < len(durations):
            count = len(durations) - done
            if self.refit_every:
                count = min(count, self.refit_every - self._since_fit)
            predicted = self.cost_model.decode_step_times(shape, count)
            steps = durations[done:done + count]
            self._record_errors([abs(p - d) / d for p, d in zip(predicted, steps, strict=True)])
            samples.append_decode_run(shape, steps)
            shape = BatchShape(shape.num_seqs, shape.num_tokens, shape.num_sampled,
                               shape.num_decode_seqs, shape.attn_pairs + count * seqs,
                               shape.kv_tokens_read + count * seqs)
            done += count
            self._since_fit += count
            if self.refit_every and self._since_fit >= self.refit_every and self._drifted():
                self.refit()
            elif self._since_fit >= self.refit_every:
                self._since_fit = 0

    def _record_errors(self, new: list[float]) -> None:
        """Append `new` to the recent errors, their running sum updated as one append
        after another would (the oldest out, then the newest in)."""
        errors = self._errors
        kept = len(errors)
        no_eviction = max(0, (errors.maxlen or 0) - kept)  # appends before the first
        out = [*errors, *new] if len(new) > no_eviction else ()
        total = self._error_sum
        for step, error in enumerate(new):
            if step >= no_eviction:
                total -= out[step - no_eviction]
            total += error
        self._error_sum = total
        errors.extend(new)

    def _drifted(self) -> bool:
        error = self.error
        return self.num_fits == 0 or error is None or error > self.tolerance

    def _linear_samples(self) -> list[Sample]:
        """The window's steps as the linear regression sees them: a step's time divided
        by the base profile's factor for its size class (the factor is charged again on
        every prediction; andante.perf.prefill_factors, andante.perf.decode_factors)."""
        base = self.base
        return [(shape, duration / base.size_factor(shape))
                for shape, duration in self._samples]

    def refit(self) -> bool:
        """Refit on the window now; False (model unchanged) with too few samples."""
        self._since_fit = 0
        if len(self._samples) < self.min_samples:
            return False
        try:
            coefficients = fit_coefficients(self.base, self._linear_samples())
        except (ValueError, ArithmeticError):
            return False
        if coefficients == self.cost_model.coefficients:
            return True
        self.cost_model = self.base.with_coefficients(coefficients)
        self.version += 1
        self.num_fits += 1
        return True
