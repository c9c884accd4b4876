"""OpenMP's wait policy for the real engine, chosen before torch loads libgomp.

Design note. Between two parallel regions an OpenMP worker either spins (waiting for
the next region without a system call) or sleeps on a futex. libgomp's default spins
GOMP_SPINCOUNT = 300,000 iterations first; OMP_WAIT_POLICY=PASSIVE sleeps at once. A
decode step of the real engine runs ~150 parallel regions a few microseconds apart, and
the choice matters only when the engine's threads share their cores (issue 32): with a
CPU-bound neighbour on one of two cores, a spinning thread burns the time slice its
descheduled partner needs, and every barrier waits for it. libgomp reads these
variables once, when it is loaded (with torch), so the engine cannot change them while
it runs (its thread adapter, andante.exec.thread_adapter, changes the thread count
instead); `choose_wait_policy` sets them at the start of the `andante` command, before
anything imports torch, unless the user set either (or ANDANTE_OMP_WAIT=keep).

The rule is OMP_WAIT_POLICY=PASSIVE, from a measurement (benchmarks/omp_wait_policy.py:
SmolLM2 bf16 decode steps at two threads, each policy in its own process; issue 32's
AVX-512 BF16 machine shared with other work, load 15-20 on 2 cores), wall ms per step at
batch 1 / 8: libgomp's default spin 2,708 / 1,351; GOMP_SPINCOUNT=10,000 379 / 432;
1,000 164 / 220; PASSIVE 49.6 / 69.4 (one thread beside the same load: 41-54 / 65-90).
Any spinning multiplies a step's time when a core is taken. What sleeping costs on a
quiet machine was not measured here (the machine was never quiet while this was built):
the calibration's note found PASSIVE's idle wait cost nothing measurable before a step
(andante.exec.torch_calibrate), and the thread adapter (andante.exec.thread_adapter)
still picks one thread or all per step size by measured step times. A user who owns
the machine sets OMP_WAIT_POLICY=ACTIVE (or GOMP_SPINCOUNT) and andante keeps it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

#: The variables libgomp reads once; a user's own setting of either is kept.
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: ANDANTE_OMP_WAIT=keep: leave OpenMP's own defaults (benchmarks measuring them).
CHOICE_ENV = "ANDANTE_OMP_WAIT"
#: The wait policy andante sets (see the note).
WAIT_POLICY = "PASSIVE"


def choose_wait_policy(environ: MutableMapping[str, str]) -> str:
    """Set andante's OpenMP wait policy in `environ` (the process environment, before
    torch is imported) unless the user chose one; what was done, for the log."""
    if environ.get(CHOICE_ENV, "") == "keep":
        return f"OpenMP wait policy: OpenMP's defaults ({CHOICE_ENV}=keep)"
    own = {k: environ[k] for k in WAIT_VARS if k in environ}
    if own:
        return f"OpenMP wait policy: the environment's ({own})"
    if "torch" in sys.modules:  # libgomp has read them already: setting them now lies
        return "OpenMP wait policy: OpenMP's defaults (torch was imported first)"
    environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return f"OpenMP wait policy: OMP_WAIT_POLICY={WAIT_POLICY} (andante's rule)"
