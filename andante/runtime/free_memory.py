"""Give the memory freed after a large request back to the system (glibc's
`malloc_trim`).

Design note: CPython hands large blocks (a parsed upload, a batch's lines, a finalized
batch's output) to the C allocator; glibc gives each worker thread its own arena, and
an arena's freed pages stay mapped until trimmed. Measured on a toy server: after four
20 MB uploads (checked and stored on worker threads) it kept ~95 MB (+30%) resident
that nothing used. `malloc_trim(0)` returns every arena's free pages. Without glibc it
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def release_free_memory() -> bool:
    """Trim the C allocator's free memory; True if glibc did it."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))
