"""A step's small kernels on one OpenMP thread while its GEMMs use all of them.

Design note. At two threads every ATen kernel above its grain size opens an OpenMP
parallel region, and under OMP_WAIT_POLICY=PASSIVE (andante.exec.omp_wait) each region
wakes the sleeping worker first: benchmarks/omp_regions.py measured a region of one
200k-element multiply at 25 us on two threads against 16.5 us on one (the best bursts,
on a busy machine; libgomp's spinning default: 8.5 us), and a SmolLM2 decode step opens
275-305 regions, 150 of them in decode attention (per layer: the K/V gather, its
float32 conversion, two batched matmuls and the softmax), kernels that take a few
microseconds each at decode sizes. Those are cheaper done on the stepping thread alone
than woken into a region, while the weight-streaming GEMMs keep both threads. The
executor times decode attention both ways at start-up (andante.exec.torch_attention.
choose_decode_threads) and runs it at the faster count.

`set_threads` is a dispatcher operator (`torch.ops.andante.set_threads`), so the
TorchScript layers can call it inside their one scripted call per step; torch's own
`set_num_threads` is not scriptable. It returns the previous count, to be restored.
"""

from __future__ import annotations

import torch

_LIBRARY = torch.library.Library("andante", "DEF")
# CONSERVATIVE: a side effect TorchScript must keep (FROM_SCHEMA would let it drop the call)
_LIBRARY.define("set_threads(int threads) -> int", alias_analysis="CONSERVATIVE")


def _set_threads(threads: int) -> int:
    previous = torch.get_num_threads()
    if threads > 0 and threads != previous:
        torch.set_num_threads(threads)
    return previous


_LIBRARY.impl("set_threads", _set_threads, "CompositeExplicitAutograd")
