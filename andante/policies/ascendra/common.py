"""What both Ascendra instance policies share: the online performance model and SLOs."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from andante.core.request import Request
from andante.engine.fast_path import FastPathDefaults
from andante.engine.policy import BasePolicy, PolicyContext
from andante.exec.batch import StepBatch, StepResult
from andante.perf.shape import BatchShape
from andante.policies.ascendra.options import RefitOptions
from andante.policies.ascendra.perf import OnlinePerfModel

_COMPUTED = attrgetter("num_computed_tokens")


def shape_with(shape: BatchShape, num_new: int, num_cached: int, samples: bool,
               out: BatchShape | None = None) -> BatchShape:
    """`shape` with one more request's chunk (written into `out`, a scratch shape
    reused across calls, when given; else a new copy)."""
    if out is None:
        out = shape.copy()
        out.add(num_new, num_cached, samples)
        return out
    c = num_new  # BatchShape.add's arithmetic on shape's figures
    out.num_seqs = shape.num_seqs + 1
    out.num_tokens = shape.num_tokens + c
    out.num_sampled = shape.num_sampled + samples
    out.attn_pairs = shape.attn_pairs + (num_cached * c + (c * c + c) * 0.5)
    out.kv_tokens_read = shape.kv_tokens_read + (num_cached + c)
    out.num_decode_seqs = shape.num_decode_seqs + (c == 1 and num_cached > 0)
    return out


def decode_shape(decodes: Sequence[Request], steps_back: int = 0) -> BatchShape:
    """The shape of one decode token of each of `decodes`, each `steps_back` tokens
    shorter than now: what `BatchShape.add(1, cached, True)` for each sums to, exactly
    (its attention-pair sum is integral)."""
    num = len(decodes)
    computed = list(map(_COMPUTED, decodes))
    cached = sum(computed) - steps_back * num
    past_prompt = num if steps_back == 0 and all(computed) else sum(
        1 for c in computed if c > steps_back)
    return BatchShape(num_seqs=num, num_tokens=num, num_sampled=num,
                      num_decode_seqs=past_prompt, attn_pairs=float(cached + num),
                      kv_tokens_read=cached + num)


class AscendraBase(BasePolicy, FastPathDefaults):
    """Keeps `perf_model` (read by the cluster's load reports) fed with every step."""

    name = "ascendra"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        if ctx.cost_model is None:
            raise ValueError(f"policy {self.name!r} needs the executor's cost model")
        refit: RefitOptions = self.options
        self.perf_model = OnlinePerfModel(ctx.cost_model, window=refit.window,
                                          refit_every=refit.refit_every,
                                          tolerance=refit.tolerance)

    def on_step_end(self, batch: StepBatch, result: StepResult) -> None:
        if batch.requests:
            self.perf_model.observe(batch.shape(), result.duration - result.swap_time)

    def on_decode_run(self, batch: StepBatch, durations: Sequence[float]) -> None:
        """Feed the performance model each step of the run, as stepping would have."""
        shape = decode_shape(batch.requests, steps_back=len(durations))
        self.perf_model.observe_decode_run(shape, durations)

    def ttft_of(self, req: Request) -> float:
        ttft = req.slo.ttft
        return ttft if ttft is not None else float(self.options.ttft_slo)
