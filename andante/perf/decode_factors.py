"""Fit how a decode step's batch size bends an engine's step time (`andante calibrate --step-log`).

Design note. Ascendra §5.1's regression is linear in a step's roofline terms, so a decode
step of d sequences is predicted to cost a constant plus a cost per sequence (its GEMM
rows, its sampled rows, the KV its attention reads). A CPU engine's small-batch GEMMs are
not linear in their rows: oneDNN picks another kernel as the row count crosses a few
sizes (a GEMV at one row, register-blocked kernels of 2-4, 8 and 16 rows), and the
paged attention of a batch changes its path with the batch size. A served log has most
of its decode steps at the batches its load ran, and one linear fit of them carries the
cost of one batch class into the others. Measured on andante's engine here (issue 32
item 5; `benchmarks/fidelity.py --cpu-time --threads 1`, process CPU time, load 13): the
served calibration's steps of one decode sat 9% above the line fitted through all its
decode steps, in both a one-segment and a four-segment fit. (The issue's quiet-machine
runs, whose decode steps took 0.86-0.89x the served fit, are not explained by this: in
CPU time the linear fit of large batches predicts 1-3 decodes within 5%, low rather
than high; see benchmarks/fidelity.py's ServedCalibration.)

The model is the prefill factors' (andante.perf.prefill_factors), on the other axis: a
step of decodes alone, d of them, costs the regression's time times the factor of its
batch class floor(log2 d) (HardwareSpec.decode_factors; CostModel.decode_factor), 1 for a
class the log does not fit. Fitted by the same code, `fit_class_factors` and
`divided_by` with `decode_batch` for the class size, so with the same bounds: per class the
median of measured over predicted time, kept where it differs from 1 by at least
MIN_DEVIATION and MIN_STANDARD_ERRORS standard errors; the coefficients are then fitted
again to the steps with each decode step's time divided by its factor, and the factors
again (andante.perf.log_fit, FACTOR_REFITS rounds). Steps with prefill tokens are the
prefill factors' and are left as they are here.
"""

from __future__ import annotations

from andante.perf.shape import BatchShape


def decode_batch(shape: BatchShape) -> int:
    """The step's decodes where it runs decodes alone (0: a step with prefill tokens)."""
    return shape.num_decode_seqs if shape.num_decode_seqs == shape.num_seqs else 0
