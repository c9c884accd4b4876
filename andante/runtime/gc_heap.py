"""Keep the garbage collector's full collections off a serving process's hot path.

Design note: CPython's cyclic collector runs a full (generation-2) collection once the
objects promoted since the last one exceed a quarter of the long-lived heap; it then
walks every tracked object. An engine process holds ~200k of them after start-up (the
model's modules, tokenizer tables, imported code): measured here, one full collection
of the embedded model's engine process took 150-160 ms on a busy 2-core machine, a
pause of the engine's thread that lands on whatever step runs then (in a burst, on the
first tokens of every request in that step). vLLM freezes its start-up heap for the
same reason (`vllm.utils.gc_utils.freeze_gc_heap`, called by its engine core and its
API server once started): objects alive after start-up move to a permanent generation
that collections skip, so later full collections walk only what serving allocated.
"""

from __future__ import annotations

import gc

from andante.perf.paths import env_switch

NO_GC_FREEZE_ENV = "ANDANTE_NO_GC_FREEZE"  # 1: leave the start-up heap to the collector


def freeze_heap() -> int:
    """Collect what start-up left as garbage, then exempt every surviving object from
    future collections; returns how many objects were frozen (0 with the switch set)."""
    if env_switch(NO_GC_FREEZE_ENV):
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
