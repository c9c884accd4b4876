"""andante.vllm.Scheduler inside the real vLLM CPU build, without a model: the checks of
tests/vllm/adapter_checks.py run once in vLLM's interpreter (about 30 s)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from andante.vllm.config import POLICIES
from tests.peers import REPO, VllmPeer

pytestmark = pytest.mark.slow  # one subprocess of ~30 s (vLLM's import dominates)

TRACES = REPO.parent / "shared" / "traces"


@pytest.fixture(scope="module")
def checks(vllm_peer: VllmPeer) -> dict[str, Any]:
    if not (TRACES / "azure_llm_2023").is_dir():
        pytest.skip(f"no traces under {TRACES}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [str(vllm_peer.python), str(Path(__file__).with_name("adapter_checks.py")),
         str(vllm_peer.model), str(TRACES)],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("case", ["equivalence", "equivalence_prefix"])
def test_vllm_policy_decides_as_vllm(checks: dict[str, Any], case: str) -> None:
    result = checks[case]
    assert result["first_diff"] is None, result["first_diff"]
    ours, theirs = result["num_steps"]
    assert ours == theirs > 100
    assert result["num_preemptions"] > 0  # the trace exercises preemption
    assert result["num_prefill_steps"] > 10


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_serves_trace_and_agrees_with_vllm_state(checks: dict[str, Any],
                                                       policy: str) -> None:
    run = checks["policies"][policy]
    assert run["errors"] == []
    assert run["unfinished"] == 0 and run["mirrors_left"] == 0
    assert run["free_blocks"] == run["total_blocks"]  # every block came back


def test_some_policies_preempt_in_the_small_cache(checks: dict[str, Any]) -> None:
    assert sum(run["num_preemptions"] > 0 for run in checks["policies"].values()) >= 2


def test_bad_configurations_are_refused_with_one_line(checks: dict[str, Any]) -> None:
    refusals = checks["refusals"]
    assert "unknown policy 'nope'" in refusals["policy"] and "andes" in refusals["policy"]
    assert "polcy" in refusals["key"]
    assert "unknown option(s) ['nope']" in refusals["option"]
    assert "--no-async-scheduling" in refusals["async"]
    assert "0.32.0" in checks["version"] and "0.31.0" in checks["version"]
    assert all("\n" not in line for line in refusals.values())
