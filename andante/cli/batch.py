"""`andante batch FILE`: run an OpenAI batch input file offline, as vLLM's `run-batch`.

The file goes through the server's own path (the Batch API's service, its durable
store, admission and the engines; no HTTP), with a progress bar on stderr; the output
file holds one line per request, in input order (`response` for answers, `error` /
an error `response` for failures). With a `--state-dir`, a run that was killed resumes:
the batch records its input's SHA-256 (`metadata.input_sha256`), and a rerun on the
same input finds the unfinished batch and waits for it instead of starting over. Also
here: the durable-queue options `andante serve` shares (`add_queue_args`,
`batch_options_from_args`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from andante.cli.options import positive_float, positive_int

EXIT_BAD_INPUT = 2


def add_queue_args(p: argparse.ArgumentParser, state_dir_default: str | None) -> None:
    g = p.add_argument_group("batch queue (the Batch API's durable store)")
    g.add_argument("--state-dir", default=state_dir_default,
                   help="directory of the SQLite queue (files, batches, results; default "
                   f"{state_dir_default or 'a temporary directory'}; $ANDANTE_STATE_DIR)")
    g.add_argument("--queue", default="sqlite", metavar="sqlite | redis://HOST:PORT",
                   help="where batch work waits: 'sqlite' (in --state-dir) or a Redis "
                   "server shared by several servers (streams, consumer groups)")
    g.add_argument("--batch-max-in-flight", type=positive_int,
                   help="batch requests on the engines at once (default: a quarter of "
                   "--max-num-seqs per instance); none start while interactive ones wait")
    g.add_argument("--queue-claim-idle", type=positive_float, default=30.0, metavar="S",
                   help="redis: another server takes over a server's batch requests once "
                   "they have been idle S seconds (default 30)")
    g.add_argument("--queue-consumer", help="redis: this server's consumer name (default "
                   "HOST-PID); a restart under the same name resumes its own requests first")
    g.add_argument("--max-file-bytes", type=positive_int, default=200 << 20,
                   help="largest upload to /v1/files (default 200 MiB)")
    g.add_argument("--file-retention-days", type=positive_float, default=30.0,
                   help="files without their own expires_after (uploads, batch outputs) "
                   "are deleted this many days after their creation (default 30)")


def batch_options_from_args(args: argparse.Namespace) -> Any:
    from andante.server.config import BatchOptions

    return BatchOptions(queue=args.queue, state_dir=args.state_dir,
                        max_in_flight=args.batch_max_in_flight,
                        claim_idle_s=args.queue_claim_idle, consumer=args.queue_consumer,
                        file_retention_s=args.file_retention_days * 86400.0)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "batch", help="run an OpenAI batch input file (JSONL) offline",
        description="Run a Batch API input file ({custom_id, method, url, body} per line, "
        "url /v1/chat/completions or /v1/completions) on the embedded model (or --model), "
        "through the server's batch path without HTTP, and write one output line per "
        "request in input order.")
    p.add_argument("file", help="the input JSONL file")
    p.add_argument("-o", "--output", help="output JSONL (default: FILE with .output.jsonl)")
    p.add_argument("--model", help="model path; default: the embedded model; 'toy': the "
                   "byte-level fake model")
    p.add_argument("--policy", default="vllm", help="scheduling policy (default vllm)")
    p.add_argument("--max-num-seqs", type=positive_int, default=64)
    p.add_argument("--num-kv-blocks", type=positive_int, help="KV-cache size in blocks")
    p.add_argument("--toy-step-ms", type=positive_float, default=5.0)
    p.add_argument("--completion-window", default="24h",
                   help="the batch's window (default 24h); requests not run by then expire")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_queue_args(p, state_dir_default=None)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from andante.server.config import EngineOptions, ServeOptions

    path = Path(args.file)
    if not path.is_file():
        print(f"andante batch: error: no such file: {path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    engine = EngineOptions(max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks,
                           toy_step_time=args.toy_step_ms / 1000.0)
    options = ServeOptions(model=args.model, policy=args.policy, engine=engine,
                           max_queued=max(256, 2 * args.max_num_seqs), log_level="warning",
                           batch=batch_options_from_args(args))
    output = Path(args.output) if args.output else path.with_suffix(".output.jsonl")
    return asyncio.run(_run(options, path, output, args.completion_window,
                            not args.no_progress))


async def _run(options: Any, path: Path, output: Path, window: str, progress: bool) -> int:
    from andante.server.backend import build_backend
    from andante.server.batches import create_batch_service
    from andante.server.errors import APIError
    from andante.server.state import ServerState

    state = ServerState.create(options, build_backend(options))
    service = create_batch_service(state)
    state.start(asyncio.get_running_loop())
    service.start()
    try:
        return await _submit_and_wait(service, path, output, window, progress)
    except APIError as exc:
        print(f"andante batch: error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        await service.stop()
        state.stop()


async def _submit_and_wait(service: Any, path: Path, output: Path, window: str,
                           progress: bool) -> int:
    from andante.cli.progress import Progress
    from andante.server.batches.input import parse_batch_file

    content = path.read_bytes()
    digest = hashlib.sha256(content).hexdigest()
    batch = _unfinished(service, digest, window)
    if batch is not None:
        print(f"andante batch: resuming {batch.id} ({batch.counts.done} of "
              f"{batch.counts.total} done)", file=sys.stderr)
    else:
        record = service.upload(path.name, "batch", content)
        urls = sorted({line.url for line in parse_batch_file(content)})
        if len(urls) > 1:
            print(f"andante batch: error: a batch has one endpoint; the file mixes {urls}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        batch = service.create(record.id, urls[0], window, {"input_sha256": digest})
    if batch.errors:
        for error in batch.errors:
            print(f"andante batch: line {error['line']}: {error['message']}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bar = Progress(batch.counts.total, "batch", enabled=None if progress else False)
    bar.advance(batch.counts.done)
    while batch.is_open:
        await asyncio.sleep(0.1)
        batch = service.get(batch.id)
        bar.advance(batch.counts.done - bar.count)
    bar.close()
    outcomes = [o for o in service.store.outcomes(batch.id) if o.kind != "cancelled"]
    output.write_text("".join(o.text + "\n" for o in outcomes), encoding="utf-8")
    counts = batch.counts
    print(json.dumps({"batch": batch.id, "status": batch.status, "completed": counts.completed,
                      "failed": counts.failed, "total": counts.total, "output": str(output)}))
    return 0


def _unfinished(service: Any, digest: str, window: str) -> Any:
    """The store's unfinished batch of this input (same content, same window), if any."""
    for batch in service.store.open_batches():
        if (batch.metadata or {}).get("input_sha256") == digest \
                and batch.completion_window == window:
            return batch
    return None
