"""andante as the control plane of a fleet (issue 29): routers on real upstream servers,
and what the proxy adds.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/fleet.py --rounds 2

Three andante toy servers (`--toy-step-ms 25`, `--max-num-seqs 8`: a step time of a
real GPU decode and a batch that fills) are the upstreams; each run starts one
`andante serve --upstream ...` process per router in front of them. The workload is
bursty (a base rate with bursts: `--rate`, `--burst-rate` for `--burst-s` of every
`--cycle-s`) and has two models — `alpha` (60%) on upstreams 0 and 1, `beta` on
upstream 2 (a toy server serves one name; each model has its own controller, so the
routers choose only among alpha's two) — and two SLO classes: interactive (TTFT
`--ttft` s, mean time between tokens `--tbt` s) and relaxed (end to end `--deadline` s).
Ascendra's pools (a fleet file): alpha's 0 is LP and 1 HP; beta's 2 is LP. Routers run in
interleaved rounds (qlm, ascendra, round-robin, least-loaded, then again in another
order), each on the same requests (seeded).

Figures per router (medians over rounds): SLO attainment (share of requests meeting
their own SLO), goodput (such requests per second of the round), TTFT p50/p99.
Then the proxy itself, its added latency measured directly: the same lean client sends
each stream twice at the same moment, once straight to the upstream and once through a
fleet of that one upstream (the pair's order alternates), so both copies meet the same
upstream, the same machine load and the same client; a request's added TTFT and added
time per token are its fleet copy's minus its direct copy's, and the figures are the
median and p99 of these per-pair differences (target <= 2 ms). `--streams` pairs are in
flight (so `--streams` streams through the fleet), in two arrival patterns
(`--proxy-pattern`): a burst (all sent at once) and a closed loop (each client sends its
next pair when its last ends). One chunk per `--proxy-step-ms`; the upstream is
`benchmarks/sse_upstream.py` (lean: little CPU of its own; `--proxy-upstream-kind toy`
for an andante toy server). Also the fleet process's CPU seconds per 1,000 tokens it
streamed, split into per request and per chunk (`--proxy-upstream URL`: in front of a
real server instead, e.g. vLLM's
CPU build). `--vllm-upstreams N` adds a routing run over N vLLM CPU servers (the peers'
install, one model): least-loaded, power-of-two and round-robin on the same bursty
workload, interleaved rounds. Prints ONE JSON line, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
ROUTERS = ("qlm", "ascendra", "round-robin", "least-loaded")
POLL_INTERVAL_S = 0.25
SHORT_ROUNDS = 3


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: list[str]) -> Server:
    state_dir = tempfile.mkdtemp(prefix="andante-bench-")  # each server its own (locked)
    proc = subprocess.Popen([sys.executable, "-m", "andante.cli.main", "serve", "--port", "0",
                             "--log-level", "warning", "--state-dir", state_dir, *args],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stdout.read()[-2000:]}")
    return Server(f"http://127.0.0.1:{match.group(1)}", proc)


def toy(name: str, step_ms: float, max_num_seqs: int) -> Server:
    return start(["--model", "toy", "--served-model-name", name, "--toy-step-ms",
                  str(step_ms), "--max-num-seqs", str(max_num_seqs)])


def fleet(urls: list[str], router: str, max_num_seqs: int,
          roles: list[str] | None = None) -> Server:
    """A fleet server; with `roles`, its upstreams come from a fleet file."""
    if roles is None:
        args = [a for u in urls for a in ("--upstream", u)]
    else:
        lines = [f'[[instances]]\nurl = "{u}"\nrole = "{r}"\nmax_num_seqs = {max_num_seqs}'
                 for u, r in zip(urls, roles, strict=True)]
        path = f"/tmp/andante-fleet-{os.getpid()}.toml"
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        args = ["--fleet", path]
    return start([*args, "--router", router, "--upstream-max-num-seqs", str(max_num_seqs),
                  "--poll-interval", str(POLL_INTERVAL_S)])


# ---- workload -----------------------------------------------------------------------
def workload(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out, t = [], 0.0
    while t < args.duration:
        in_burst = (t % args.cycle_s) < args.burst_s
        t += rng.expovariate(args.burst_rate if in_burst else args.rate)
        interactive = rng.random() < 0.5
        max_tokens = rng.randint(20, 100)
        # an interactive client's TTFT and pace imply its end-to-end deadline (what a
        # deadline-ordered router such as qlm reads); attainment checks TTFT and TBT
        slo = ({"ttft": args.ttft, "tbt": args.tbt,
                "deadline": args.ttft + max_tokens * args.tbt} if interactive
               else {"deadline": args.deadline})
        out.append({"at": t, "model": "alpha" if rng.random() < 0.6 else "beta",
                    "max_tokens": max_tokens, "slo": slo})
    return out


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                     sent: float) -> dict[str, Any]:
    times: list[float] = []
    status = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    times.append(time.perf_counter())
    except httpx.HTTPError:
        status = -1
    return {"status": status, "sent": sent, "times": times}


def meets(result: dict[str, Any], slo: dict[str, float], max_tokens: int) -> bool:
    times = result["times"]
    if result["status"] != 200 or len(times) < max_tokens:
        return False
    ttft = times[0] - result["sent"]
    if "ttft" not in slo:
        return times[-1] - result["sent"] <= slo["deadline"]
    tbt = (times[-1] - times[0]) / max(1, len(times) - 1)
    return ttft <= slo["ttft"] and tbt <= slo["tbt"]


async def run_round(url: str, requests: list[dict[str, Any]], duration: float
                    ) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start_t = time.perf_counter()

        async def fire(spec: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start_t + spec["at"] - time.perf_counter()))
            body = {"model": spec["model"], "prompt": "x" * 64, "stream": True,
                    "max_tokens": spec["max_tokens"], "ignore_eos": True, "slo": spec["slo"]}
            return await one_stream(client, url, body, time.perf_counter())

        results = await asyncio.gather(*(fire(s) for s in requests))
    ok = [meets(r, s["slo"], s["max_tokens"]) for r, s in zip(results, requests, strict=True)]
    ttfts = sorted(r["times"][0] - r["sent"] for r in results if r["times"])
    return {"attainment": sum(ok) / len(ok), "goodput": sum(ok) / duration,
            "ttft_p50": _pct(ttfts, 50), "ttft_p99": _pct(ttfts, 99),
            "errors": sum(r["status"] != 200 for r in results), "requests": len(results)}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def routers_part(args: argparse.Namespace) -> dict[str, Any]:
    ups = [toy("alpha", args.step_ms, args.max_num_seqs),
           toy("alpha", args.step_ms, args.max_num_seqs),
           toy("beta", args.step_ms, args.max_num_seqs)]
    per_router: dict[str, list[dict[str, Any]]] = {r: [] for r in ROUTERS}
    try:
        for round_no in range(args.rounds):
            order = ROUTERS if round_no % 2 == 0 else tuple(reversed(ROUTERS))
            requests = workload(args, args.seed + round_no)
            for router in order:
                roles = ["lp", "hp", "lp"] if router == "ascendra" else None
                front = fleet([u.url for u in ups], router, args.max_num_seqs, roles)
                try:
                    result = asyncio.run(run_round(front.url, requests, args.duration))
                finally:
                    front.stop()
                result["load_avg"] = os.getloadavg()[0]
                per_router[router].append(result)
                print(f"round {round_no} {router}: {result}", file=sys.stderr, flush=True)
    finally:
        for u in ups:
            u.stop()
    return {r: _medians(rs) for r, rs in per_router.items()}


VLLM_ROUTERS = ("least-loaded", "power-of-two", "round-robin")
VLLM_MODEL_NAME = "smollm2"
VLLM_START_S = 400.0


def vllm_upstream(max_num_seqs: int, log_dir: str) -> Server:
    """One vLLM CPU server (the peers' install: benchmarks/peers/setup) serving the
    embedded model as `smollm2`, on a free port, started in its own session."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peer_paths import VLLM_MODEL, VLLM_PYTHON

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(VLLM_MODEL), "--served-model-name", VLLM_MODEL_NAME, "--dtype", "bfloat16",
           "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs),
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    env = {**ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = open(os.path.join(log_dir, f"vllm-{port}.log"), "wb")  # noqa: SIM115 (the server's)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + VLLM_START_S
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"vLLM did not start (log: {log.name})")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Server(url, proc)
        except httpx.HTTPError:
            pass
        time.sleep(1)


def vllm_routers_part(args: argparse.Namespace) -> dict[str, Any]:
    """`--vllm-upstreams N` vLLM CPU servers, one model: least-loaded, power-of-two and
    round-robin in interleaved rounds of the bursty workload (every request for it)."""
    log_dir = tempfile.mkdtemp(prefix="andante-fleet-vllm-")
    ups: list[Server] = []
    per_router: dict[str, list[dict[str, Any]]] = {r: [] for r in VLLM_ROUTERS}
    try:
        for _ in range(args.vllm_upstreams):
            ups.append(vllm_upstream(args.max_num_seqs, log_dir))
        for round_no in range(args.rounds):
            order = VLLM_ROUTERS if round_no % 2 == 0 else tuple(reversed(VLLM_ROUTERS))
            requests = [{**r, "model": VLLM_MODEL_NAME}
                        for r in workload(args, args.seed + round_no)]
            for router in order:
                front = fleet([u.url for u in ups], router, args.max_num_seqs)
                try:
                    result = asyncio.run(run_round(front.url, requests, args.duration))
                finally:
                    front.stop()
                result["load_avg"] = os.getloadavg()[0]
                per_router[router].append(result)
                print(f"vllm round {round_no} {router}: {result}", file=sys.stderr,
                      flush=True)
    finally:
        for u in ups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(u.proc.pid, signal.SIGTERM)
            try:
                u.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(u.proc.pid, signal.SIGKILL)
                u.proc.wait(10)
    return {"upstreams": args.vllm_upstreams, "model": VLLM_MODEL_NAME,
            **{r: _medians(rs) for r, rs in per_router.items()}}


def _medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("attainment", "goodput", "ttft_p50", "ttft_p99", "errors")
    out = {k: statistics.median([r[k] for r in rounds if r[k] is not None] or [0])
           for k in keys}
    out["rounds"] = rounds
    return out


# ---- proxy overhead -------------------------------------------------------------------
class LeanClient:
    """A keep-alive streaming client that costs little CPU (the proxy figures compare
    clients' views, so the client should not crowd the machine): each read's new SSE
    events are stamped with the read's time."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def stream(self, body: dict[str, Any], sent: float) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (self.host.encode(), self.port, len(payload)))
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(head + payload)
        times: list[float] = []
        buf, seen, status = b"", 0, 0
        while not buf.endswith(b"0\r\n\r\n"):
            data = await reader.read(65536)
            if not data:
                status = -1
                break
            now = time.perf_counter()
            buf += data
            if not status and b"\r\n" in buf:
                status = int(buf.split(b" ", 2)[1])
                if status != 200:
                    break
            count = buf.count(b"data: {")
            times.extend([now] * (count - seen))
            seen = count
        if status == 200:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return {"status": status, "sent": sent, "times": times}

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


PROXY_BODY = {"model": "proxy", "prompt": "x" * 64, "stream": True, "ignore_eos": True}


async def concurrent_streams(url: str, count: int, tokens: int) -> list[dict[str, Any]]:
    """`count` streams sent at once (a burst)."""
    client = LeanClient(url)
    body = {**PROXY_BODY, "max_tokens": tokens}
    try:
        return await asyncio.gather(*(client.stream(body, time.perf_counter())
                                      for _ in range(count)))
    finally:
        client.close()


Pair = tuple[dict[str, Any], dict[str, Any]]  # (direct, through the fleet)


async def _pair(direct: LeanClient, fleet_c: LeanClient, body: dict[str, Any],
                fleet_first: bool) -> Pair:
    """One stream sent twice at the same moment: straight and through the fleet."""
    sent = time.perf_counter()
    calls = [direct.stream(body, sent), fleet_c.stream(body, sent)]
    if fleet_first:
        calls.reverse()
    got = await asyncio.gather(*calls)
    return (got[1], got[0]) if fleet_first else (got[0], got[1])


async def paired_burst(direct_url: str, fleet_url: str, count: int, tokens: int
                       ) -> list[Pair]:
    """`count` pairs sent at once."""
    direct, fleet_c = LeanClient(direct_url), LeanClient(fleet_url)
    body = {**PROXY_BODY, "max_tokens": tokens}
    try:
        return await asyncio.gather(*(_pair(direct, fleet_c, body, i % 2 == 1)
                                      for i in range(count)))
    finally:
        direct.close()
        fleet_c.close()


async def paired_loop(direct_url: str, fleet_url: str, count: int, tokens: int,
                      seconds: float) -> tuple[list[Pair], list[Pair]]:
    """`count` clients, each sending its next pair when its last ends, their first
    starts spread over one stream's length: `count` pairs in flight at every moment.
    The pairs but those of the first and last stream-length (ramp up and down), and all
    the pairs."""
    direct, fleet_c = LeanClient(direct_url), LeanClient(fleet_url)
    body = {**PROXY_BODY, "max_tokens": tokens}
    try:
        probe = await direct.stream(body, time.perf_counter())
        length = probe["times"][-1] - probe["sent"] if probe["times"] else 1.0
        start_t = time.perf_counter()
        stop_t = start_t + seconds

        async def client_loop(i: int) -> list[Pair]:
            await asyncio.sleep(length * i / count)
            out, n = [], i
            while time.perf_counter() < stop_t:
                out.append(await _pair(direct, fleet_c, body, n % 2 == 1))
                n += 1
            return out

        runs = await asyncio.gather(*(client_loop(i) for i in range(count)))
    finally:
        direct.close()
        fleet_c.close()
    pairs = [p for ps in runs for p in ps]
    return [p for p in pairs if start_t + length <= p[0]["sent"] <= stop_t - length], pairs


def _stream_figures(r: dict[str, Any]) -> tuple[float, float] | None:
    """A finished stream's TTFT and mean time per token (s), else None."""
    if r["status"] != 200 or len(r["times"]) < 2:
        return None
    times = r["times"]
    return times[0] - r["sent"], (times[-1] - times[0]) / (len(times) - 1)


def _paired_figures(pairs: list[Pair]) -> dict[str, float]:
    """Median and p99 (ms) of the per-pair added TTFT and added time per token (fleet
    copy minus direct copy), each side's medians, and the fleet's tokens."""
    ttft: list[float] = []
    per_token: list[float] = []
    sides: dict[str, list[tuple[float, float]]] = {"direct": [], "fleet": []}
    errors = 0
    for direct, through in pairs:
        d, f = _stream_figures(direct), _stream_figures(through)
        if d is None or f is None:
            errors += 1
            continue
        sides["direct"].append(d)
        sides["fleet"].append(f)
        ttft.append(f[0] - d[0])
        per_token.append(f[1] - d[1])
    if not ttft:
        return {"pairs": 0, "errors": errors, "fleet_tokens": 0}
    ttft.sort()
    per_token.sort()
    out = {"pairs": len(ttft), "errors": errors,
           "added_ttft_ms": statistics.median(ttft) * 1e3,
           "added_ttft_p99_ms": (_pct(ttft, 99) or 0.0) * 1e3,
           "added_per_token_ms": statistics.median(per_token) * 1e3,
           "added_per_token_p99_ms": (_pct(per_token, 99) or 0.0) * 1e3}
    for side, values in sides.items():
        out[f"{side}_ttft_ms"] = statistics.median(v[0] for v in values) * 1e3
        out[f"{side}_per_token_ms"] = statistics.median(v[1] for v in values) * 1e3
    return out


def cpu_split(front: Server, args: argparse.Namespace, cpu_long: float, chunks_long: int
              ) -> tuple[float, float]:
    """The fleet's CPU per request and per streamed chunk: a round of short streams
    (`--short-tokens`) next to the long one, cpu = requests * R + chunks * C solved."""
    cpu0 = front.cpu_s()
    chunks_short = 0
    for _ in range(SHORT_ROUNDS):  # the CPU clock ticks in 10 ms: enough requests
        results = asyncio.run(concurrent_streams(front.url, args.streams, args.short_tokens))
        chunks_short += sum(len(r["times"]) for r in results if r["status"] == 200)
    cpu_short = (front.cpu_s() - cpu0) / SHORT_ROUNDS
    chunks_short //= SHORT_ROUNDS
    per_chunk = (cpu_long - cpu_short) / max(1, chunks_long - chunks_short)
    return (cpu_short - chunks_short * per_chunk) / args.streams, per_chunk


def _run_pairs(pattern: str, direct_url: str, fleet_url: str, args: argparse.Namespace
               ) -> tuple[list[Pair], int]:
    """The pairs to measure, and the tokens the fleet streamed in all."""
    if pattern == "burst":
        pairs = asyncio.run(paired_burst(direct_url, fleet_url, args.streams, args.tokens))
        every = pairs
    else:
        pairs, every = asyncio.run(paired_loop(direct_url, fleet_url, args.streams,
                                               args.tokens, args.closed_loop_s))
    return pairs, sum(len(f["times"]) for _, f in every if f["status"] == 200)


def _over_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds."""
    keys = [k for k in rounds[0] if k.endswith("_ms")]
    return {k: statistics.median(r[k] for r in rounds if k in r) for k in keys}


def lean_upstream(step_ms: float) -> Server:
    """benchmarks/sse_upstream.py: an upstream that costs little CPU."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sse_upstream.py")
    proc = subprocess.Popen([sys.executable, script, "--step-ms", str(step_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
    assert match, "the lean upstream did not start"
    return Server(f"http://127.0.0.1:{match.group(1)}", proc)


def proxy_part(args: argparse.Namespace) -> dict[str, Any]:
    up = None
    if args.proxy_upstream is None:
        up = (lean_upstream(args.proxy_step_ms) if args.proxy_upstream_kind == "lean"
              else toy("proxy", args.proxy_step_ms, 128))
    url = up.url if up is not None else args.proxy_upstream
    front = fleet([url], "least-loaded", 128)
    patterns = ("burst", "closed-loop") if args.proxy_pattern == "both" else (
        args.proxy_pattern,)
    rows: dict[str, list[dict[str, float]]] = {p: [] for p in patterns}
    cpu_per_k: list[float] = []
    splits: list[tuple[float, float]] = []
    try:
        for target in (url, front.url):  # warm: connections open, code paths run once
            asyncio.run(concurrent_streams(target, args.streams, args.short_tokens))
        for _ in range(args.proxy_rounds):
            for pattern in patterns:
                cpu0 = front.cpu_s()
                pairs, tokens = _run_pairs(pattern, url, front.url, args)
                cpu = front.cpu_s() - cpu0
                figures = _paired_figures(pairs)
                figures["fleet_tokens"] = tokens
                figures["load_avg"] = os.getloadavg()[0]
                figures["fleet_cpu_s_per_1k_tokens"] = cpu / max(
                    1, figures["fleet_tokens"]) * 1000
                rows[pattern].append(figures)
                print(f"proxy {pattern}: {figures}", file=sys.stderr, flush=True)
                cpu_per_k.append(figures["fleet_cpu_s_per_1k_tokens"])
                if pattern == "burst":
                    splits.append(cpu_split(front, args, cpu, int(figures["fleet_tokens"])))
    finally:
        front.stop()
        if up is not None:
            up.stop()
    out: dict[str, Any] = {
        "streams": args.streams, "tokens_per_stream": args.tokens,
        "upstream": args.proxy_upstream or (
            f"{args.proxy_upstream_kind}, {args.proxy_step_ms:g} ms steps"),
        "target_added_ms": 2.0}
    for pattern in patterns:
        done = [r for r in rows[pattern] if r["pairs"]]
        out[pattern] = {**(_over_rounds(done) if done else {}), "rounds": rows[pattern]}
    if cpu_per_k:
        out.update({
            "fleet_cpu_s_per_1k_tokens": statistics.median(cpu_per_k),
            "fleet_cpu_ms_per_request": statistics.median(r for r, _ in splits) * 1e3,
            "fleet_cpu_us_per_chunk": statistics.median(c for _, c in splits) * 1e6})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--burst-rate", type=float, default=30.0)
    p.add_argument("--burst-s", type=float, default=1.5)
    p.add_argument("--cycle-s", type=float, default=6.0)
    p.add_argument("--ttft", type=float, default=1.0)
    p.add_argument("--tbt", type=float, default=0.1)
    p.add_argument("--deadline", type=float, default=15.0)
    p.add_argument("--step-ms", type=float, default=25.0)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--short-tokens", type=int, default=5,
                   help="tokens per stream of the round that splits the fleet's CPU into "
                   "per request and per chunk")
    p.add_argument("--proxy-step-ms", type=float, default=20.0)
    p.add_argument("--proxy-rounds", type=int, default=2)
    p.add_argument("--proxy-upstream", metavar="URL",
                   help="measure the proxy in front of this server (serving a model named "
                   "'proxy', e.g. vLLM with --served-model-name proxy) instead of a toy one")
    p.add_argument("--proxy-upstream-kind", choices=("lean", "toy"), default="lean",
                   help="lean: benchmarks/sse_upstream.py (little CPU of its own, so what "
                   "the comparison shows is the proxy's); toy: an andante toy server")
    p.add_argument("--proxy-pattern", choices=("burst", "closed-loop", "both"),
                   default="both", help="burst: --streams sent at once; closed-loop: "
                   "--streams clients each sending its next stream when the last ends")
    p.add_argument("--closed-loop-s", type=float, default=6.0,
                   help="seconds of each closed-loop round")
    p.add_argument("--skip-routers", action="store_true")
    p.add_argument("--skip-proxy", action="store_true")
    p.add_argument("--vllm-upstreams", type=int, default=0, metavar="N",
                   help="also route over N vLLM CPU servers (the peers' install; each "
                   "~1-2 GB, a minute to start): least-loaded, power-of-two, round-robin "
                   "on the same workload, all for one model")
    args = p.parse_args()
    load_before = os.getloadavg()
    out: dict[str, Any] = {"benchmark": "fleet", "load_avg_before": load_before}
    if not args.skip_routers:
        out["routers"] = routers_part(args)
    if args.vllm_upstreams:
        out["vllm_routers"] = vllm_routers_part(args)
    if not args.skip_proxy:
        out["proxy"] = proxy_part(args)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
