"""Process RSS of a served model awake, asleep at level 1 and 2, and woken (sleep mode,
andante.server.sleep): what `POST /sleep` really gives back to the machine.

Serves the embedded SmolLM2-135M (the default `andante serve` model) in this process with
--dev-mode, answers one greedy prompt, then sleeps at each level and wakes, reading
VmRSS from /proc/self/status after each call (and after a completion, so that the
figures include a served step's activations). Prints one JSON line; `--kv-cache-gib`
sets the KV pool (the server's default plans it from free memory, which on a shared
machine varies run to run). Linux only.

    PYTHONPATH=. python benchmarks/sleep_rss.py --kv-cache-gib 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from andante.server import ServeOptions, ServerThread  # noqa: E402

PROMPT = "Name three colours of the rainbow."


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def complete(url: str) -> str:
    answer = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    answer.raise_for_status()
    text: str = answer.json()["choices"][0]["text"]
    return text


def call(url: str, path: str, **params: int) -> None:
    httpx.post(f"{url}{path}", params=params, timeout=300).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    args = parser.parse_args()
    options = ServeOptions(port=0, log_level="warning", dev_mode=True)
    options = dataclasses.replace(options, engine=dataclasses.replace(
        options.engine, kv_cache_gib=args.kv_cache_gib))
    figures: dict[str, object] = {"kv_cache_gib": args.kv_cache_gib}
    with ServerThread(options) as server:
        url = server.url
        before = complete(url)
        figures["awake_mib"] = round(rss_mib(), 1)
        same = True
        for level in (1, 2):
            call(url, "/sleep", level=level)
            figures[f"asleep_level{level}_mib"] = round(rss_mib(), 1)
            call(url, "/wake_up")
            figures[f"woken_from_level{level}_mib"] = round(rss_mib(), 1)
            same = same and complete(url) == before
            figures[f"after_serving_level{level}_mib"] = round(rss_mib(), 1)
        figures["answers_identical"] = same
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
