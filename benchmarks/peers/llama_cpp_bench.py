"""Offline micro-benchmark of llama.cpp (llama-cpp-python, CPU build), a peer of andante.

Run with the llama.cpp venv's interpreter (benchmarks/peers/setup makes it)::

    "$ANDANTE_PEERS/llama-venv/bin/python" benchmarks/peers/llama_cpp_bench.py \
        --model FILE.gguf [--threads 2] [--repeats 5]

It prints ONE JSON line on stdout with the same figures, prompts and definitions as
benchmarks/vllm_peer/vllm_offline_bench.py (whose `synthetic_prompt` and `INDEX_BASE`
it loads): prefill of 256 tokens (wall time of prefill + the first greedy token),
decode step time at batch 1 and 8 (context 128, (last token - first token) / 32), and
16 concurrent requests of 128 prompt + 64 output tokens (output tokens / wall second).

Batching. llama-cpp-python's high-level `Llama` class serves one sequence at a time, so
this script uses its low-level bindings of llama.cpp's C API, the way llama.cpp's own
server batches: one context with `n_seq_max` sequences in a unified KV cache, and one
`llama_decode` call per step over every running sequence (each token tagged with its
sequence id). Prompts of a batch are prefilled together in one call (llama.cpp splits
it into micro-batches of `--n-ubatch` tokens), then every decode step is one call with
one token per sequence. Sampling is greedy: argmax of each output row's logits.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
VLLM_BENCH = HERE.parent / "vllm_peer" / "vllm_offline_bench.py"


def _prompt_module() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_offline_bench", VLLM_BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LlamaEngine:
    """One llama.cpp context serving up to `max_seqs` sequences, greedy, batched."""

    def __init__(self, args: argparse.Namespace) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        if not args.verbose:
            self._silence()
        started = time.perf_counter()
        mparams = lc.llama_model_default_params()
        mparams.use_extra_bufts = args.extra_bufts
        self.model = lc.llama_model_load_from_file(str(args.model).encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {args.model}")
        self._init_context(args)
        vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        self.capacity = args.n_batch
        self.batch = lc.llama_batch_init(self.capacity, 0, 1)
        self.startup_s = time.perf_counter() - started

    def _silence(self) -> None:
        callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        self._log_cb = callback(lambda level, text, data: None)  # keep a reference
        self.lc.llama_log_set(self._log_cb, ctypes.c_void_p())

    def _init_context(self, args: argparse.Namespace) -> None:
        lc = self.lc
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = args.n_ctx
        cparams.n_batch = args.n_batch
        cparams.n_ubatch = args.n_ubatch
        cparams.n_seq_max = args.max_seqs
        cparams.kv_unified = True
        cparams.n_threads = args.threads
        cparams.n_threads_batch = args.threads
        cparams.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.memory = lc.llama_get_memory(self.ctx)

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.memory, True)

    def _decode(self, tokens: list[int], positions: list[int], seqs: list[int],
                outputs: list[int]) -> list[int]:
        """One llama_decode over the given tokens; greedy token of each output row."""
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"{n} tokens exceed the batch capacity {self.capacity}")
        b = self.batch
        np.ctypeslib.as_array(b.token, shape=(n,))[:] = tokens
        np.ctypeslib.as_array(b.pos, shape=(n,))[:] = positions
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        logits_flags = np.ctypeslib.as_array(b.logits, shape=(n,))
        logits_flags[:] = 0
        logits_flags[outputs] = 1
        for i, seq in enumerate(seqs):
            b.seq_id[i][0] = seq
        b.n_tokens = n
        status = self.lc.llama_decode(self.ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        return [int(np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, i),
                                          shape=(self.n_vocab,)).argmax())
                for i in outputs]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, float]:
        """Greedy-generate `max_tokens` per prompt, all sequences batched; returns (wall,
        time of the first tokens, time of the last tokens), seconds from the start."""
        self.clear()
        started = time.perf_counter()
        tokens, positions, seqs, outputs = [], [], [], []
        for seq, prompt in enumerate(prompts):
            tokens += prompt
            positions += range(len(prompt))
            seqs += [seq] * len(prompt)
            outputs.append(len(tokens) - 1)
        last = self._decode(tokens, positions, seqs, outputs)
        first_at = time.perf_counter() - started
        lengths = [len(p) for p in prompts]
        all_seqs = list(range(len(prompts)))
        for step in range(max_tokens - 1):
            last = self._decode(last, [n + step for n in lengths], all_seqs, all_seqs)
        elapsed = time.perf_counter() - started
        return elapsed, first_at, elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp

    prompts_module = _prompt_module()
    engine = LlamaEngine(args)
    index = dict(prompts_module.INDEX_BASE)

    def prompts(phase: str, count: int, length: int) -> list[list[int]]:
        start = index[phase]
        index[phase] += count
        return [prompts_module.synthetic_prompt(length, i) for i in range(start, start + count)]

    engine.generate(prompts("warmup", 1, args.prefill_len), 1)
    for b in (1, 8):
        engine.generate(prompts("warmup", b, args.decode_ctx), 1 + args.decode_steps)
    engine.generate(prompts("warmup", args.conc_requests, args.conc_prompt), args.conc_output)

    prefill = [engine.generate(prompts("prefill", 1, args.prefill_len), 1)[0]
               for _ in range(args.repeats)]
    n = args.decode_steps
    decode: dict[str, Any] = {}
    for b in (1, 8):
        steps, wall = [], []
        for _ in range(args.repeats):
            first = engine.generate(prompts("decode", b, args.decode_ctx), 1)[0]
            full, first_at, last_at = engine.generate(prompts("decode", b, args.decode_ctx),
                                                      1 + n)
            steps.append((last_at - first_at) / n)
            wall.append((full - first) / n)
        step = statistics.median(steps)
        decode[f"b{b}"] = {"ms_per_step": round(step * 1e3, 2), "tok_s": round(b / step, 1),
                           "ms_per_step_all": [round(s * 1e3, 2) for s in steps],
                           "ms_per_step_wall": round(statistics.median(wall) * 1e3, 2)}
    conc = [args.conc_requests * args.conc_output
            / engine.generate(prompts("concurrent", args.conc_requests, args.conc_prompt),
                              args.conc_output)[0]
            for _ in range(max(1, (args.repeats + 1) // 2))]
    load1, load5, _ = os.getloadavg()
    return {
        "engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__,
        "model": str(args.model), "threads": args.threads, "extra_bufts": args.extra_bufts,
        "batching": "one llama_decode per step over all sequences (unified KV)",
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "loadavg_1m_5m_at_end": [round(load1, 2), round(load5, 2)],
        "startup_s": round(engine.startup_s, 2),
        "prefill_len": args.prefill_len,
        "prefill_ms": round(statistics.median(prefill) * 1e3, 1),
        "prefill_ms_all": [round(p * 1e3, 1) for p in prefill],
        "decode_ctx": args.decode_ctx, "decode_steps": args.decode_steps, "decode": decode,
        "concurrent": {"requests": args.conc_requests, "prompt_len": args.conc_prompt,
                       "output_len": args.conc_output,
                       "out_tok_s": round(statistics.median(conc), 1),
                       "out_tok_s_all": [round(c, 1) for c in conc]},
        "python": platform.python_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="GGUF file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--n-batch", type=int, default=2048,
                        help="most tokens per llama_decode call")
    parser.add_argument("--n-ubatch", type=int, default=512,
                        help="llama.cpp's micro-batch (its server's default)")
    parser.add_argument("--max-seqs", type=int, default=16)
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--decode-ctx", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--conc-requests", type=int, default=16)
    parser.add_argument("--conc-prompt", type=int, default=128)
    parser.add_argument("--conc-output", type=int, default=64)
    parser.add_argument("--no-extra-bufts", dest="extra_bufts", action="store_false",
                        help="no extra weight buffer types (AMX / repacked layouts)")
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's logs")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"no such GGUF file: {args.model}")
    if args.conc_requests > args.max_seqs:
        parser.error("--conc-requests must not exceed --max-seqs")
    return args


def main(argv: list[str] | None = None) -> int:
    record = run(parse_args(argv))
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
