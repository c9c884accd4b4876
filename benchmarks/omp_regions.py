"""How many OpenMP parallel regions the real engine's steps open, by operator, and what
one region costs under each OpenMP wait policy.

Why (issue 32): at two threads each parallel region wakes the second OpenMP thread.
Under OMP_WAIT_POLICY=PASSIVE (andante's rule, andante.exec.omp_wait) the worker sleeps
between regions and every region pays a futex wake-up; vLLM CPU keeps libgomp's default
(spin, threads bound to cores), where a region costs a few microseconds on a quiet
machine but, beside other work, a spinning thread burns the time slice its partner needs.
So a step's cost at two threads is about its one-thread work / 2 plus regions x the
policy's cost per region.

Two measurements, each in its own process (libgomp reads its policy once, at load):
- `regions`: a shim (a few lines of C, built with the system's `cc` into a temporary
  directory) interposes libgomp's `GOMP_parallel` through LD_PRELOAD and counts the
  regions it opens; the child process runs the bf16 TorchExecutor's forward pass (the
  embedded SmolLM2 unless `--model`; layer form `--layer-form`) on fresh prompts NxC of
  `--prefill` and decode batches of `--decode` at context 128, at `--threads` threads,
  and attributes the regions of one step to the ATen operators that opened them (a
  TorchDispatchMode, which also sees the operators the TorchScript layers call).
- `region_us`: per policy of `--policies` (`passive`, `default`: libgomp's spin,
  `spin:N`: GOMP_SPINCOUNT=N), one elementwise multiply of `--elements` float32 values
  (above ATen's grain size, so it opens one region at two threads) timed in `--bursts`
  bursts of 50 calls, at one thread and at two: the fastest, the 10th percentile and the
  median burst's microseconds per call. The fastest bursts are the quiet case; the
  median shows the load at the time.
The 1-minute load average before and after. Prints ONE JSON line. Run it under
`nice -n 10` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
static atomic_long regions;
long andante_omp_regions(void) { return atomic_load(&regions); }
typedef void (*parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static parallel_fn real;
    if (!real) real = (parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    atomic_fetch_add(&regions, 1);
    real(fn, data, num_threads, flags);
}
"""

POLICIES = {"passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "default": {}}
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy: str) -> dict[str, str]:
    """The OpenMP variables of `policy` (passive, default or spin:N)."""
    if policy in POLICIES:
        return POLICIES[policy]
    if policy.startswith("spin:") and policy[5:].isdigit():
        return {"GOMP_SPINCOUNT": policy[5:]}
    raise argparse.ArgumentTypeError(f"a policy is passive, default or spin:N, got {policy!r}")


def build_shim(directory: Path) -> Path:
    """The region-counting shim, compiled into `directory`."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) to build the region-counting shim")
    source, library = directory / "omp_count.c", directory / "libomp_count.so"
    source.write_text(SHIM_C)
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source),
                    "-ldl"], check=True, capture_output=True)
    return library


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return {**env, **extra}


def run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"omp_regions child {args[:1]} failed: {proc.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


# ---- the children ----------------------------------------------------------------------
def count_regions(opts: argparse.Namespace) -> dict[str, Any]:
    """In a process started with the shim preloaded: regions per step and by operator."""
    import ctypes
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(HERE))
    from decode_step import build_executor
    from prefill_step import prefill_batch

    from andante.exec.torch_threads import probe_batch

    counter = ctypes.CDLL(None).andante_omp_regions
    counter.restype = ctypes.c_long

    class ByOperator(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.regions: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            before = counter()
            out = func(*args, **(kwargs or {}))
            if counter() > before:
                self.regions[str(func)] += counter() - before
            return out

    build_args = argparse.Namespace(model=opts.model, decode_attention="auto",
                                    layer_form=opts.layer_form, threads=[opts.threads],
                                    batches=[max(opts.decode)])
    executor = build_executor(build_args)
    torch.set_num_threads(opts.threads)
    block_size = executor.options.block_size
    steps = {f"prefill_{n}x{c}": prefill_batch(n, c, block_size) for n, c in opts.prefill}
    steps.update({f"decode_b{b}": probe_batch(b, block_size, 128) for b in opts.decode})
    out: dict[str, Any] = {}
    for name, batch in steps.items():
        executor._forward(batch)  # warm-up: primitives built, buffers sized
        mode = ByOperator()
        before = counter()
        with mode:
            executor._forward(batch)
        out[name] = {"total": counter() - before, "by_op": dict(mode.regions.most_common())}
    return {"threads": opts.threads, "epilogues": executor.epilogues,
            "prefill_matmul": executor.inputs.prefill_matmul,
            "decode_matmul": executor.inputs.decode_matmul, "steps": out}


def region_cost(opts: argparse.Namespace) -> dict[str, Any]:
    """Microseconds per one-region elementwise op at one thread and at two."""
    import time

    import torch

    x = torch.randn(opts.elements)
    y = torch.empty_like(x)

    def burst() -> float:
        started = time.perf_counter()
        for _ in range(50):
            torch.mul(x, 1.0001, out=y)
        return (time.perf_counter() - started) / 50 * 1e6

    out: dict[str, Any] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        burst()
        times = sorted(burst() for _ in range(opts.bursts))
        out[f"t{threads}"] = {"min": round(times[0], 1),
                              "p10": round(times[len(times) // 10], 1),
                              "median": round(times[len(times) // 2], 1)}
    return out


# ---- the parent ------------------------------------------------------------------------
def parse_shape(text: str) -> tuple[int, int]:
    n, _, c = text.lower().partition("x")
    if not (n.isdigit() and c.isdigit()) or int(n) < 1 or int(c) < 2:
        raise argparse.ArgumentTypeError(f"a prefill shape is NxC (e.g. 1x256), got {text!r}")
    return int(n), int(c)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--layer-form", default=None, choices=("auto", "epilogue", "plain"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", type=parse_shape, nargs="*", default=[(1, 256), (8, 128)])
    p.add_argument("--decode", type=int, nargs="*", default=[1, 8, 16])
    p.add_argument("--policies", type=str, nargs="*", default=["passive", "default"])
    p.add_argument("--elements", type=int, default=200_000)
    p.add_argument("--bursts", type=int, default=200)
    p.add_argument("--no-count", action="store_true", help="only the cost per region")
    p.add_argument("--child", choices=("count", "cost"), default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = parser().parse_args(argv)
    for policy in opts.policies:
        policy_env(policy)
    if opts.child == "count":
        print(json.dumps(count_regions(opts)))
        return 0
    if opts.child == "cost":
        print(json.dumps(region_cost(opts)))
        return 0
    load = [os.getloadavg()[0]]
    record: dict[str, Any] = {}
    if not opts.no_count and (opts.prefill or opts.decode):
        with tempfile.TemporaryDirectory() as tmp:
            shim = build_shim(Path(tmp))
            record["regions"] = run_child(
                [*argv, "--child", "count"],
                child_env({"LD_PRELOAD": str(shim), "OMP_WAIT_POLICY": "PASSIVE"}))
    record["region_us"] = {policy: run_child([*argv, "--child", "cost"],
                                             child_env(policy_env(policy)))
                           for policy in opts.policies}
    load.append(os.getloadavg()[0])
    print(json.dumps({**record, "elements": opts.elements, "load": load}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
