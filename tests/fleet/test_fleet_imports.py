"""The fleet front's process imports neither torch nor the engine server: started
through `andante serve --upstream` in a fresh interpreter (the upstream is a closed
port, so start-up stops at discovery with its clear line), then its modules listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from andante.server.listen import bind

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SIDE = ("torch", "andante.models.loader", "andante.server.backend", "andante.server.app")

SCRIPT = """
import json, sys
from andante.cli.main import main
import andante.server.fleet_launch, andante.server.fleet_app, andante.server.fleet_batches
status = main(["serve", "--upstream", sys.argv[1], "--port", "0"])
print(json.dumps({"status": status, "loaded": [m for m in %r if m in sys.modules]}))
"""


def _closed_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def test_fleet_start_up_imports_no_torch_nor_engine() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT % (ENGINE_SIDE,), f"http://127.0.0.1:{_closed_port()}"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["status"] == 2, proc.stderr  # the unreachable upstream's clear line
    assert "127.0.0.1" in proc.stderr
    assert report["loaded"] == []
