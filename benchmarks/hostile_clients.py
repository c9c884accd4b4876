"""Hostile clients against a toy server, each probe's figures (issue 26).

    nice -n 10 .venv/bin/python benchmarks/hostile_clients.py
    # the same probes against another tree's server (e.g. before the fixes):
    nice -n 10 .venv/bin/python benchmarks/hostile_clients.py --server-tree /path/to/tree

One `andante serve --model toy` (its own process; `--toy-step-ms 20`, `--header-timeout
1 --body-timeout 1`, and `--upload-timeout 5` where the server has it) with 20 streaming
completions running throughout (`andante.bench.hostile.Watch`). Every attack of
`andante.bench.hostile` runs alone, then four copies at once, from a separate process at
the lowest CPU priority. Per attack: its own figures (statuses, seconds to the answer,
how long trickling connections were held, capped at 8 s), the longest pause of any
stream and the slowest `/health` while it ran, and the server's peak resident memory.
Also: the quiet period's pause and `/health` (the machine's noise), the server's memory
before, at its peak and 20 s after the last attack, whether it is still up, and the
load average. Prints ONE JSON line.

Targets (issue 26): no stream pauses more than 0.5 s, `/health` within 0.2 s, memory
back within 20% of its baseline, the server up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from andante.bench.hostile import Watch, attacks_in_subprocess, rss_bytes, toy_server_process

QUIET_S = 5.0
SETTLE_S = 20.0


class PeakMemory:
    """The largest resident memory of a process since the last `take`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, ValueError):
                return
            time.sleep(0.05)

    def take(self) -> int:
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _server_env(tree: str | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    return env


def _has_option(env: dict[str, str], cwd: str | None, option: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "andante.cli.main", "serve", "--help"],
                         capture_output=True, text=True, env=env, cwd=cwd, timeout=120).stdout
    return option in out


def run(tree: str | None, state_dir: str) -> dict[str, Any]:
    tree = os.path.abspath(tree) if tree else None
    env = _server_env(tree)
    args = ["--toy-step-ms", "20", "--header-timeout", "1", "--body-timeout", "1",
            "--state-dir", state_dir]
    if _has_option(env, tree, "--upload-timeout"):
        args += ["--upload-timeout", "5"]
    attacker_env = _server_env(None)  # the attacks are this tree's
    mib = 1 << 20
    with toy_server_process(*args, env=env, cwd=tree) as (url, proc):
        watch = Watch(url, num_streams=20).start()
        time.sleep(3.0)
        baseline = rss_bytes(proc.pid)
        peaks = PeakMemory(proc.pid)
        watch.reset()
        time.sleep(QUIET_S)
        quiet = watch.reset().to_json()
        peaks.take()
        probes = []
        for result in attacks_in_subprocess(url, env=attacker_env):
            result["watch"] = watch.reset().to_json()
            result["peak_rss_mib"] = round(peaks.take() / mib, 1)
            probes.append(result)
        watch.stop()
        time.sleep(SETTLE_S)
        after = rss_bytes(proc.pid)
        peaks.stop()
        up = proc.poll() is None
    return {"server_tree": tree or "this", "server_args": args, "quiet": quiet,
            "rss_mib": {"baseline": round(baseline / mib, 1),
                        "peak": max(p["peak_rss_mib"] for p in probes),
                        "after_20s": round(after / mib, 1)},
            "server_up": up, "probes": probes, "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server-tree", help="run the server from this source tree "
                        "(PYTHONPATH), e.g. the code before the fixes")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="andante-hostile-") as state_dir:
        print(json.dumps(run(args.server_tree, state_dir)))


if __name__ == "__main__":
    main()
