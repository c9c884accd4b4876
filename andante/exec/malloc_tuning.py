"""Keep freed heap memory in the process instead of handing it back to the kernel.

Design note. A large step (a 2,048-token prefill of 16 prompts) allocates and frees
activations of several MB per op. glibc's malloc serves blocks above its mmap
threshold with fresh mmap()s and trims the heap top above its trim threshold; both
thresholds adapt upwards only to the largest block freed so far, so the big steps kept
returning memory to the kernel and faulting it back in, zero-filled, page by page:
20-57 thousand minor page faults and 50-130 ms of system CPU time per 2,048-token step
on this machine. With the mmap threshold at its maximum (32 MiB) and the trim threshold
at 1 GiB, the same step takes 100-300 faults and 13-23 ms of system time (busy
machine, three interleaved rounds each; 256-token steps had no faults either way).
vLLM's CPU backend gets the same effect by preloading tcmalloc. The cost is that the
process keeps its peak heap resident. glibc only (elsewhere, or with
`ANDANTE_NO_MALLOC_TUNING=1`, nothing changes).
"""

import ctypes
import ctypes.util
import logging

from andante.perf.paths import env_switch

log = logging.getLogger(__name__)

DISABLE_ENV = "ANDANTE_NO_MALLOC_TUNING"

#: mallopt(3) parameters and the values set.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 1 << 30

_applied = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when set (now or
    earlier), False where disabled or not glibc."""
    global _applied
    if _applied:
        return True
    if env_switch(DISABLE_ENV):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    except (OSError, AttributeError, TypeError):
        return False
    if ok:
        _applied = True
        log.debug("malloc: mmap threshold %d, trim threshold %d", MMAP_THRESHOLD,
                  TRIM_THRESHOLD)
    return ok


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel now (glibc's malloc_trim(0)), as
    sleep mode wants after dropping the KV cache or the weights: the raised trim
    threshold would otherwise keep them resident. True when trimmed."""
    name = ctypes.util.find_library("c")
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError, TypeError):
        return False
