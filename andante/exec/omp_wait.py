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

What PASSIVE costs where the machine is quiet (issue 32): each of a 256-token prefill's
~700 regions (benchmarks/omp_regions.py) wakes the sleeping worker, 24-93 us apiece at
two threads against 8.5-10.6 us with libgomp's spin, which vLLM CPU keeps. So
ANDANTE_OMP_WAIT=auto looks first: the others' share of our allowed CPUs over
LOOK_SECONDS from /proc/stat (andante.exec.cpu_share, not the lagging load average); below
IDLE_OTHERS_SHARE it leaves libgomp's default (spin GOMP_SPINCOUNT=300,000 iterations,
then sleep: bounded), else PASSIVE. A neighbour that arrives later is the thread
adapter's (andante.exec.thread_adapter): steps at two threads that jump to JUMP x their
reference drop to one thread, which opens no parallel region, so the spinning wait has
no barrier left to slow. "auto" is not the default: its quiet-machine gain and its
neighbour-after-start cost were not measured on a quiet machine yet (the one it was
built on ran at load 11-15 throughout).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping

from andante.exec.cpu_share import (
    IDLE_OTHERS_SHARE,
    CpuTimes,
    measure_others_share,
    read_cpu_times,
)

log = logging.getLogger(__name__)

#: The variables libgomp reads once; a user's own setting of either is kept.
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
#: ANDANTE_OMP_WAIT=keep: leave OpenMP's own defaults (benchmarks measuring them).
CHOICE_ENV = "ANDANTE_OMP_WAIT"
#: The wait policy andante sets (see the note).
WAIT_POLICY = "PASSIVE"
#: ANDANTE_OMP_WAIT=auto: libgomp's spinning wait when the machine looks idle at start.
AUTO = "auto"
#: How long "auto" watches the machine's CPU accounting before choosing.
LOOK_SECONDS = 0.3


def others_share_now(seconds: float = LOOK_SECONDS,
                     reader: Callable[[], CpuTimes | None] = read_cpu_times) -> float | None:
    """Other processes' share, over the next `seconds`, of the CPUs this process may run
    on (andante.exec.cpu_share; None where /proc/stat cannot be read)."""
    return measure_others_share(lambda: time.sleep(seconds), reader)[1]


def choose_wait_policy(environ: MutableMapping[str, str],
                       look: Callable[[], float | None] = others_share_now) -> str:
    """Set andante's OpenMP wait policy in `environ` (the process environment, before
    torch is imported) unless the user chose one; what was done, for the log. With
    ANDANTE_OMP_WAIT=auto, `look()` (the others' CPU share now) decides (see the note)."""
    choice = environ.get(CHOICE_ENV, "")
    if choice == "keep":
        return f"OpenMP wait policy: OpenMP's defaults ({CHOICE_ENV}=keep)"
    own = {k: environ[k] for k in WAIT_VARS if k in environ}
    if own:
        return f"OpenMP wait policy: the environment's ({own})"
    if "torch" in sys.modules:  # libgomp has read them already: setting them now lies
        return "OpenMP wait policy: OpenMP's defaults (torch was imported first)"
    if choice == AUTO:
        share = look()
        seen = "not measurable" if share is None else f"{share:.2f}"
        if share is not None and share < IDLE_OTHERS_SHARE:
            return (f"OpenMP wait policy: OpenMP's spinning wait ({CHOICE_ENV}=auto: "
                    f"others' CPU share {seen} at start)")
        environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        return (f"OpenMP wait policy: OMP_WAIT_POLICY={WAIT_POLICY} ({CHOICE_ENV}=auto: "
                f"others' CPU share {seen} at start)")
    environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return f"OpenMP wait policy: OMP_WAIT_POLICY={WAIT_POLICY} (andante's rule)"
