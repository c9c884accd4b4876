"""Write a multi-turn conversation trace with block ids, in Mooncake's JSONL format.

    .venv/bin/python benchmarks/conversation_trace.py OUT.jsonl [--conversations 400]
        [--rate 1.0] [--mean-turns 4] [--system-prompts 4] [--system-tokens 2048] [--seed 0]

Conversations start as a Poisson process (`--rate` per second). Each opens with one of
`--system-prompts` shared system prompts (`--system-tokens` long) and has a geometric
number of turns (mean `--mean-turns`); a turn's prompt is the conversation so far (every
earlier prompt and answer) plus new user text (lognormal, mean 200 tokens), its answer
lognormal with mean 250 tokens, and the next turn arrives after the answer (at 30
tokens/s) and a think time (exponential, mean 20 s). Each row has Mooncake's columns:
`timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the ids of the prompt's
512-token blocks: equal ids for equal content (the shared system prompt, the history a
turn repeats), a fresh id for a block that holds new text. `andante simulate --workload
trace:OUT.jsonl` reads it as it reads a Mooncake trace, prefix caching included.
Prints ONE JSON line: rows, conversations, mean prompt and output tokens, and the hit
rate a single cache that never evicts would reach (the ceiling for any router).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

SPAN = 512  # tokens per id: Mooncake's block


@dataclass(frozen=True, slots=True)
class Turn:
    time: float
    prompt: int
    output: int
    ids: tuple[int, ...]


def _lognormal(rng: random.Random, mean: float, sigma: float = 0.8) -> int:
    return max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))


def conversation_turns(num_conversations: int, rate: float, mean_turns: float,
                       num_system: int, system_tokens: int, seed: int = 0,
                       max_context: int = 32_768) -> list[Turn]:
    """Every turn of every conversation, by arrival time (see the module note)."""
    rng, fresh = random.Random(seed), count(1_000_000)
    systems = [tuple(range(k * 1000, k * 1000 + system_tokens // SPAN)) for k in range(num_system)]
    turns: list[Turn] = []
    start = 0.0
    for _ in range(num_conversations):
        start += rng.expovariate(rate)
        ids, covered, t = systems[rng.randrange(num_system)], system_tokens, start
        while True:
            user, answer = _lognormal(rng, 200), _lognormal(rng, 250)
            prompt = covered + user
            if prompt + answer > max_context:
                break
            kept = ids[:covered // SPAN]
            ids = kept + tuple(next(fresh) for _ in range(-(-prompt // SPAN) - len(kept)))
            turns.append(Turn(t, prompt, answer, ids))
            covered = prompt + answer  # the next turn repeats this turn and its answer
            if rng.random() < 1.0 / mean_turns:
                break
            t += answer / 30.0 + rng.expovariate(1 / 20.0)
    turns.sort(key=lambda turn: turn.time)
    return turns


def ceiling_hit_rate(turns: list[Turn], block_size: int = 16) -> float:
    """Hit / queried prompt tokens of one cache that keeps every block it ever saw (a
    prompt block counts as cached once an earlier prompt had the same ids up to it)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for turn in turns:
        usable = (turn.prompt - 1) // block_size
        keys = [turn.ids[:((j + 1) * block_size - 1) // SPAN + 1]
                for j in range(min(usable, len(turn.ids) * SPAN // block_size))]
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        hit += n * block_size
        total += turn.prompt
        seen.update(keys)
    return hit / total if total else 0.0


def write_trace(path: Path, turns: list[Turn]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for turn in turns:
            out.write(json.dumps({"timestamp": round(turn.time * 1000), "input_length":
                                  turn.prompt, "output_length": turn.output,
                                  "hash_ids": list(turn.ids)}) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--conversations", type=int, default=400)
    p.add_argument("--rate", type=float, default=1.0, help="conversations per second")
    p.add_argument("--mean-turns", type=float, default=4.0)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    turns = conversation_turns(args.conversations, args.rate, args.mean_turns,
                               args.system_prompts, args.system_tokens, args.seed)
    write_trace(args.out, turns)
    summary = {"benchmark": "conversation_trace", "rows": len(turns),
               "conversations": args.conversations,
               "mean_prompt_tokens": round(sum(t.prompt for t in turns) / len(turns), 1),
               "mean_output_tokens": round(sum(t.output for t in turns) / len(turns), 1),
               "ceiling_hit_rate": round(ceiling_hit_rate(turns), 4)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
