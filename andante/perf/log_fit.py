"""Fit a hardware profile to an engine's step log (`andante calibrate --step-log`).

Design note. Ascendra §5.1 fits its step-time regression to steps the engine ran; here
the steps come from a log a real engine wrote while serving (andante.perf.step_log),
whichever engine it is, so a profile describes that engine on that machine with that
model. The GPU's datasheet rates come from a base profile (`base`): they set the
roofline terms tM and tF; the regression's coefficients (non-negative least squares on
relative error, with the KV-read term: andante.perf.fit, reweighted by its own
predictions so that noisy single steps give their mean: `fit_means`) carry everything
else.

A log can be too thin to fit, and a fit of a thin log would extrapolate without
saying so; so before fitting, `check_log` refuses, naming what is missing:
- fewer than MIN_DISTINCT_SHAPES distinct step shapes (sequence, token and decode
  counts; the growing context of one batch does not make new shapes), or fewer than
  MIN_SHAPES_PER_KIND among the decode-only steps or among the steps with prefill
  tokens (a log of one kind cannot tell prefill cost from decode cost);
- durations that do not increase with the step's work (Spearman rank correlation of the
  roofline time tM + tF with the measured duration below MIN_WORK_CORRELATION, over the
  log's step shapes: each shape class's median work against its median duration): the
  durations are not the steps' own times (idle waits included), or the log is of
  another model than the one named. Per shape, not per step: a small model's decode
  steps of 1-18 sequences differ in work by a few percent, less than one step's noise
  on a shared CPU, and a served log is mostly such steps, so a per-step correlation
  fell to 0.43 on a valid vLLM CPU log of SmolLM2-135M (issue 31); the medians per
  shape of eight such logs correlate at 0.88-0.99, and the same logs with their
  durations shuffled at 0.26 at most.
A step that took more than STALL_FACTOR times (or less than 1/STALL_FACTOR of) what a
fit of the other steps predicts is a stall, not the cost of its shape (a busy machine, a
paused process: a served log on this project's shared 2-core machine had steps of
14-20 s among steps of about 0.1 s); up to MAX_STALL_SHARE of the steps are left out
and counted, more and the log is refused. A fit that explains its own steps badly is
the caller's to refuse (`andante calibrate --max-error`). The profile records the range
of shapes it was fitted on (`fitted_on`), which `andante simulate` prints with it.

Launch floor. An engine that replays only its decode steps as CUDA graphs launches its
prefills op by op, and a short prefill then takes as long as the host needs to launch
it, whatever its GPU work (the shared H200 measurement: 25 ms for 128 and for 512
tokens). Where a log marks steps as launched op by op (`graph: false`), `fit_launch_floor`
tries the k least-work such steps on a flat floor (k = 0, 2, 3, ...; their durations
within FLOOR_SPREAD of its median), fits the coefficients to the other steps, and keeps
the k with the least mean error over all steps; the floor is stored per layer
(`eager_launch_per_layer`), the host's launching being proportional to the layers.

Idle wake. A step after the engine sat idle can cost more than its shape (a served
engine waking up); `fit_idle_wake` (andante.perf.idle_wake) fits that from the
residuals of the fitted model into `idle_wake` and `idle_wake_after`; where it finds
one, the coefficients are fitted again to the steps less their wake (`without_wake`:
on a log where most prompts find the engine idle, the wake would otherwise pass for
prefill cost), and the wake again to the new coefficients, until it settles (moves by
under WAKE_SETTLED, at most MAX_WAKE_REFITS times). The fit
error and the errors per kind are of the steps less their wake.

Prefill and decode factors. A served engine whose step time bends with the prefill size
gets a factor per size class of the steps' prefill tokens (andante.perf.prefill_factors),
one whose decode steps bend with their batch a factor per batch class
(andante.perf.decode_factors), the coefficients refitted to the steps divided by them
(`_fit_size_factors`); where factors are found, the wake is fitted once more against
the profile with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from andante.perf.cost_model import CostModel
from andante.perf.decode_factors import decode_batch
from andante.perf.fit import MIN_REGIME_SAMPLES, Sample, fit_coefficients, prediction_error
from andante.perf.frontend_log import FrontendFit
from andante.perf.idle_wake import IdleWakeFit, fit_idle_wake
from andante.perf.prefill_factors import divided_by, fit_class_factors, prefill_tokens
from andante.perf.specs import CostCoefficients, HardwareSpec, ModelSpec
from andante.perf.step_log import LoggedStep

MIN_DISTINCT_SHAPES = 6
MIN_SHAPES_PER_KIND = 2
MIN_WORK_CORRELATION = 0.5
FLOOR_SPREAD = 0.15  # the steps on a launch floor lie within this of its median
FLOOR_GAIN = 0.01  # a floor is kept only where it lowers the mean error by this much
REWEIGHTS = 3  # refits weighted by the previous fit's predictions (`fit_means`)
STALL_FACTOR = 4.0  # a step this far off the others' fit is a stall (`split_stalls`)
MAX_STALL_SHARE = 0.05  # more stalled steps than this share: the log is refused
MAX_WAKE_REFITS = 10  # coefficient refits with the idle wake taken out of woken steps
WAKE_SETTLED = 0.01  # ... until the wake moves by less than this share
FACTOR_REFITS = 3  # rounds of prefill and decode factors and coefficients (_fit_size_factors)


class LogFitRefused(ValueError):
    """A step log that cannot give a trustworthy profile; the message says why."""


@dataclass(frozen=True, slots=True)
class KindError:
    """How the fitted profile predicts the log's steps of one kind."""

    num_steps: int
    mean_error: float  # mean |predicted - measured| / measured
    ratio: float  # sum of predicted over sum of measured


@dataclass(slots=True)
class LogFit:
    """The fitted profile, its mean |relative error| over the log's steps, per kind."""

    hardware: HardwareSpec
    error: float
    by_kind: dict[str, KindError]
    num_steps: int
    num_shapes: int
    engines: list[str]
    num_on_floor: int = 0
    num_stalled: int = 0  # steps left out as stalls (`split_stalls`)
    num_derived_shapes: int = 0  # steps without attn_pairs (pairs estimated)
    samples: list[Sample] = field(default_factory=list)
    frontend: FrontendFit | None = None  # the front end's fit (andante.perf.frontend_log)
    idle_wake: IdleWakeFit | None = None  # a step after idle (andante.perf.idle_wake)
    by_threads: dict[int, KindError] = field(default_factory=dict)  # where steps say
    num_other_threads: int = 0  # steps left out as run on other threads (`threads`)


def shape_class(step: LoggedStep) -> tuple[int, int, int]:
    """What makes two steps different shapes for a fit: their sequence, token and decode
    counts (not the context, which grows by itself while a batch decodes)."""
    return (step.shape.num_seqs, step.shape.num_tokens, step.shape.num_decode_seqs)


def _rank_correlation(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (ties broken by order: fine for a sanity bound)."""
    rx = np.argsort(np.argsort(np.asarray(x, dtype=float)))
    ry = np.argsort(np.argsort(np.asarray(y, dtype=float)))
    if np.std(rx) == 0 or np.std(ry) == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def work_correlation(steps: Sequence[LoggedStep], model: CostModel) -> float:
    """Spearman's rank correlation, over the steps' shape classes (`shape_class`), of
    each class's median roofline time (tM + tF) with its median measured duration."""
    by_class: dict[tuple[int, int, int], tuple[list[float], list[float]]] = {}
    for step in steps:
        work, durations = by_class.setdefault(shape_class(step), ([], []))
        work.append(sum(model.terms(step.shape)))
        durations.append(step.duration)
    medians = [(float(np.median(w)), float(np.median(d))) for w, d in by_class.values()]
    return _rank_correlation([w for w, _ in medians], [d for _, d in medians])


def check_log(steps: Sequence[LoggedStep], model: CostModel) -> None:
    """Refuse a log too thin or too inconsistent to fit (LogFitRefused, naming why)."""
    if not steps:
        raise LogFitRefused('the log has no step records ({"kind": "step", ...}): was it '
                            "written with step logging on (andante serve --trace-steps, "
                            'vLLM\'s {"andante": {"step_log": PATH}})?')
    decode = {shape_class(s) for s in steps if not s.has_prefill}
    prefill = {shape_class(s) for s in steps if s.has_prefill}
    num_shapes = len(decode | prefill)
    if not prefill or not decode:
        missing, have = ("prefill", "decode-only") if not prefill else ("decode", "prefill")
        raise LogFitRefused(
            f"all {len(steps)} steps are {have} steps: the log has no {missing} steps, so "
            f"their cost cannot be fitted; record while the engine serves both new prompts "
            "and running generations")
    if num_shapes < MIN_DISTINCT_SHAPES:
        raise LogFitRefused(
            f"only {num_shapes} distinct step shapes (sequence, token and decode counts) in "
            f"{len(steps)} steps; a fit needs at least {MIN_DISTINCT_SHAPES}: record under "
            "varied load (prompts of several lengths, several requests at once)")
    for kind, classes in (("decode-only", decode), ("prefill", prefill)):
        if len(classes) < MIN_SHAPES_PER_KIND:
            raise LogFitRefused(
                f"the {kind} steps have only {len(classes)} distinct shape(s); a fit needs "
                f"at least {MIN_SHAPES_PER_KIND} of each kind (several "
                f"{'batch sizes' if kind == 'decode-only' else 'prompt lengths'})")
    correlation = work_correlation(steps, model)
    if correlation < MIN_WORK_CORRELATION:
        raise LogFitRefused(
            f"the step durations do not increase with the steps' work (rank correlation "
            f"{correlation:.2f} between roofline time and duration over the "
            f"{num_shapes} step shapes' medians, need at least "
            f"{MIN_WORK_CORRELATION}): the durations may include waits that are not the "
            f"step's own, or the log is of another model than {model.model.name}")


def fit_means(model: CostModel, samples: Sequence[Sample]) -> CostCoefficients:
    """Relative non-negative least squares (andante.perf.fit), refitted REWEIGHTS times
    with the previous fit's predictions as each step's scale instead of its own
    duration. A log has one noisy duration per step, and weighting a step by its own
    duration favours the fast ones: on a busy machine's served log the plain fit put the
    sum of the decode steps 21% below the measured sum, this one 2% (the simulator's
    TPOT and TTFT are such sums)."""
    coefficients = fit_coefficients(model, samples, kv_term=True)
    for _ in range(REWEIGHTS):
        fitted = model.with_coefficients(coefficients)
        scale = [fitted.step_time(shape) for shape, _ in samples]
        if min(scale) <= 0:
            break  # a step the fit predicts as free: keep the plain relative fit
        coefficients = fit_coefficients(model, samples, kv_term=True, scale=scale)
    return coefficients


def _fit_regimes(model: CostModel, samples: Sequence[Sample],
                 serial_below_tokens: int | None
                 ) -> tuple[CostCoefficients, CostCoefficients | None]:
    """`fit_means` per thread regime, as andante.perf.fit.fit_by_threads splits them:
    (all threads, one thread or None)."""
    if serial_below_tokens is not None:
        serial = [s for s in samples if s[0].num_tokens < serial_below_tokens]
        parallel = [s for s in samples if s[0].num_tokens >= serial_below_tokens]
        if min(len(serial), len(parallel)) >= MIN_REGIME_SAMPLES:
            return fit_means(model, parallel), fit_means(model, serial)
    return fit_means(model, samples), None


def _with_floor(hardware: HardwareSpec, model: ModelSpec, floor: float) -> HardwareSpec:
    return dataclasses.replace(hardware, eager_launch_per_layer=floor / model.num_layers)


def fit_launch_floor(model: CostModel, steps: Sequence[LoggedStep],
                     coefficients: CostCoefficients) -> tuple[CostCoefficients, float, int]:
    """(coefficients, floor seconds, steps on it): see the module note. Without steps
    launched op by op, or where no floor helps, the coefficients given and no floor."""
    all_samples = [(s.shape, s.duration) for s in steps]
    base_error = prediction_error(model.with_coefficients(coefficients), all_samples)
    eager = sorted((s for s in steps if s.graph is False and s.has_prefill),
                   key=lambda s: sum(model.terms(s.shape)))
    best = (coefficients, 0.0, 0, base_error - FLOOR_GAIN)
    for k in range(2, len(eager) + 1):
        on_floor = eager[:k]
        floor = float(np.median([s.duration for s in on_floor]))
        if any(abs(s.duration - floor) > FLOOR_SPREAD * floor for s in on_floor):
            break  # the k least-work steps are not flat: neither are more of them
        floor_ids = {id(s) for s in on_floor}
        others = [s for s in steps if id(s) not in floor_ids]
        if len({shape_class(s) for s in others}) < MIN_DISTINCT_SHAPES:
            break
        rest = [(s.shape, s.duration) for s in others]
        fitted = fit_means(model, rest)
        floored = CostModel(model.model, _with_floor(model.hardware.with_coefficients(
            fitted), model.model, floor), model.tp)
        error = prediction_error(floored, all_samples)
        if error < best[3]:
            best = (fitted, floor, k, error)
    return best[0], best[1], best[2]


def _by_kind(model: CostModel, steps: Sequence[LoggedStep]) -> dict[str, KindError]:
    out: dict[str, KindError] = {}
    for kind in ("decode", "mixed", "prefill"):
        part = [s for s in steps if s.kind == kind]
        if not part:
            continue
        predicted = [model.step_time(s.shape) for s in part]
        measured = [s.duration for s in part]
        out[kind] = KindError(
            len(part),
            sum(abs(p - m) / m for p, m in zip(predicted, measured, strict=True)) / len(part),
            sum(predicted) / sum(measured))
    return out


def _by_threads(model: CostModel, steps: Sequence[LoggedStep]) -> dict[int, KindError]:
    """The fit's error over the steps run on each thread count (the log's `threads`)."""
    counts = sorted({s.threads for s in steps if s.threads is not None})
    out: dict[int, KindError] = {}
    for count in counts:
        part = [s for s in steps if s.threads == count]
        predicted = [model.step_time(s.shape) for s in part]
        measured = [s.duration for s in part]
        out[count] = KindError(
            len(part),
            sum(abs(p - m) / m for p, m in zip(predicted, measured, strict=True)) / len(part),
            sum(predicted) / sum(measured))
    return out


def on_threads(steps: Sequence[LoggedStep], threads: int) -> list[LoggedStep]:
    """The steps run on `threads` compute threads; LogFitRefused where the log does not
    record threads, or none ran on that many."""
    if not any(s.threads is not None for s in steps):
        raise LogFitRefused("the log's steps do not record their compute threads "
                            "('threads': andante serve --trace-steps with a torch executor "
                            "writes them), so they cannot be chosen by thread count")
    kept = [s for s in steps if s.threads == threads]
    if not kept:
        have = sorted({s.threads for s in steps if s.threads is not None})
        raise LogFitRefused(f"no step of the log ran on {threads} thread(s) (it has "
                            f"{', '.join(map(str, have))})")
    return kept


def coverage(steps: Sequence[LoggedStep]) -> str:
    """The range of shapes a log covers, in words."""
    prefill = [s.shape.num_tokens - s.shape.num_decode_seqs for s in steps if s.has_prefill]
    decode = [s.shape.num_decode_seqs for s in steps]
    classes = len({shape_class(s) for s in steps})
    return (f"{len(steps)} steps, {classes} shapes: prefill tokens per step "
            f"{min(prefill, default=0)}-{max(prefill, default=0)}, decodes per step "
            f"up to {max(decode, default=0)}, KV read per step up to "
            f"{max(s.shape.kv_tokens_read for s in steps)} tokens")


def split_stalls(model: CostModel, steps: Sequence[LoggedStep]
                 ) -> tuple[list[LoggedStep], list[LoggedStep]]:
    """(the steps to fit, the stalled ones): a step off by more than STALL_FACTOR from
    what a fit of the others predicts, either way, is not the engine's cost of its shape
    (a machine too busy to run it, a pause of the process). Two rounds: the first fit
    sees every step. Steps launched op by op are kept: they are the launch floor's."""
    kept = list(steps)
    for _ in range(2):
        fitted = model.with_coefficients(fit_coefficients(
            model, [(s.shape, s.duration) for s in kept], kv_term=True))
        off = {id(s) for s in steps if s.graph is not False
               and not 1 / STALL_FACTOR <= s.duration / max(fitted.step_time(s.shape), 1e-12)
               <= STALL_FACTOR}
        kept = [s for s in steps if id(s) not in off]
    stalled = [s for s in steps if id(s) in off]
    if len(stalled) > MAX_STALL_SHARE * len(steps):
        raise LogFitRefused(
            f"{len(stalled)} of {len(steps)} steps took more than {STALL_FACTOR:g}x (or "
            f"less than 1/{STALL_FACTOR:g}) what the other steps predict (e.g. line "
            f"{stalled[0].line}: {stalled[0].duration * 1e3:.0f} ms): the machine was too "
            "busy or the engine stalled while it logged; record on a quiet machine")
    return kept, stalled


def fit_step_log(steps: Sequence[LoggedStep], model_spec: ModelSpec, base: HardwareSpec,
                 name: str, tp: int = 1, serial_below_tokens: int | None = None,
                 source: str = "step log", threads: int | None = None) -> LogFit:
    """Fit `base`'s coefficients to the logged steps and return the profile `name`:
    `base`'s rates and sizes, the fitted coefficients (two sets where
    `serial_below_tokens` splits the steps, andante.perf.fit.fit_by_threads), a launch
    floor where the log shows one, no new-size setup. LogFitRefused for a thin log, or
    one with too many stalled steps (`split_stalls`; the few others are left out and
    counted). `threads`: fit only the steps run on that many compute threads (the
    others are counted in `num_other_threads`; `on_threads`)."""
    num_logged = len(steps)
    if threads is not None:
        steps = on_threads(steps, threads)
    num_other_threads = num_logged - len(steps)
    plain = dataclasses.replace(base, name=name, serial_coefficients=None,
                                serial_below_tokens=None, eager_launch_per_layer=0.0,
                                new_size_fixed=0.0, new_size_per_token=0.0, new_size_cache=0,
                                prefill_factors=(), decode_factors=(),
                                fit_error=None, calibrated_at=None, fitted_on=None)
    model = CostModel(model_spec, plain, tp)
    check_log(steps, model)
    steps, stalled = split_stalls(model, steps)
    fitted, on_floor = _fit_shapes(model, steps, serial_below_tokens)
    wake = fit_idle_wake(steps, CostModel(model_spec, fitted, tp).step_time)
    for _ in range(MAX_WAKE_REFITS):
        if wake.penalty <= 0:
            break
        fitted, on_floor = _fit_shapes(model, without_wake(steps, wake), serial_below_tokens)
        previous = wake.penalty
        wake = fit_idle_wake(steps, CostModel(model_spec, fitted, tp).step_time)
        if abs(wake.penalty - previous) <= WAKE_SETTLED * previous:
            break
    fitted, on_floor, factors, decode_factors = _fit_size_factors(
        model, without_wake(steps, wake), serial_below_tokens, fitted, on_floor)
    if factors or decode_factors:  # the wake against what the profile will charge
        wake = fit_idle_wake(steps, CostModel(model_spec, dataclasses.replace(
            fitted, prefill_factors=factors, decode_factors=decode_factors), tp).step_time)
    engines = sorted({s.engine for s in steps if s.engine is not None})
    fitted = dataclasses.replace(
        fitted, idle_wake=wake.penalty, idle_wake_after=wake.after, prefill_factors=factors,
        decode_factors=decode_factors,
        fitted_on=f"{source} ({', '.join(engines) or 'engine not named'}, "
                  f"{model_spec.name}, tp {tp}): {coverage(steps)}"
                  + (f"; {len(stalled)} stalled steps left out" if stalled else "")
                  + (f"; only steps on {threads} thread(s)" if threads is not None else ""))
    fitted_model = CostModel(model_spec, fitted, tp)
    shaped = without_wake(steps, wake)  # what the profile's step times stand for
    samples: list[Sample] = [(s.shape, s.duration) for s in shaped]
    return LogFit(hardware=fitted, error=prediction_error(fitted_model, samples),
                  by_kind=_by_kind(fitted_model, shaped), num_steps=len(steps),
                  num_shapes=len({shape_class(s) for s in steps}), engines=engines,
                  num_on_floor=on_floor, num_stalled=len(stalled),
                  num_derived_shapes=sum(not s.exact_shape for s in steps), samples=samples,
                  idle_wake=wake, by_threads=_by_threads(fitted_model, shaped),
                  num_other_threads=num_other_threads)


def _fit_shapes(model: CostModel, steps: Sequence[LoggedStep],
                serial_below_tokens: int | None) -> tuple[HardwareSpec, int]:
    """(model's profile with the coefficients and launch floor fitted to `steps`, the
    steps on the floor)."""
    samples: list[Sample] = [(s.shape, s.duration) for s in steps]
    coefficients, serial = _fit_regimes(model, samples, serial_below_tokens)
    floor, on_floor = 0.0, 0
    if serial is None:
        coefficients, floor, on_floor = fit_launch_floor(model, steps, coefficients)
    hardware = dataclasses.replace(
        _with_floor(model.hardware.with_coefficients(coefficients), model.model, floor),
        serial_coefficients=serial,
        serial_below_tokens=serial_below_tokens if serial is not None else None)
    return hardware, on_floor


def _fit_size_factors(model: CostModel, steps: Sequence[LoggedStep],
                      serial_below_tokens: int | None, fitted: HardwareSpec,
                      on_floor: int) -> tuple[HardwareSpec, int, tuple[float, ...],
                                              tuple[float, ...]]:
    """(profile, steps on the launch floor, prefill factors, decode factors): the factors
    of andante.perf.prefill_factors and andante.perf.decode_factors against `fitted`, then
    the coefficients refitted to the steps divided by them and the factors again,
    FACTOR_REFITS times; `fitted` as it is where no factor is found."""
    linear = (fitted, on_floor)
    factors: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    for _ in range(FACTOR_REFITS):
        predict = CostModel(model.model, fitted, model.tp).step_time
        found = (fit_class_factors(steps, predict, prefill_tokens),
                 fit_class_factors(steps, predict, decode_batch))
        if found == factors:
            break
        factors = found
        fitted, on_floor = (_fit_shapes(model, divided_by(divided_by(
                                            steps, found[0], prefill_tokens),
                                            found[1], decode_batch), serial_below_tokens)
                            if found != ((), ()) else linear)
    return fitted, on_floor, factors[0], factors[1]


def without_wake(steps: Sequence[LoggedStep], wake: IdleWakeFit) -> list[LoggedStep]:
    """The steps as their shapes cost them: those after `wake.after` seconds idle or
    more less the wake's penalty (kept above a tenth of their measured time), as the
    simulator adds it (CostModel.wake_time)."""
    if wake.penalty <= 0:
        return list(steps)
    return [dataclasses.replace(s, duration=max(s.duration - wake.penalty, 0.1 * s.duration))
            if s.idle_before is not None and s.idle_before > 0
            and s.idle_before >= wake.after else s for s in steps]
