"""Checks of andante.vllm.Scheduler inside vLLM's own process (run with vLLM's Python).

    PYTHONPATH=REPO python tests/vllm/adapter_checks.py MODEL_DIR TRACE_DIR  # one JSON line

`tests/vllm/test_adapter.py` runs it once and asserts on its parts:
- equivalence: andante's `vllm` policy and vLLM's own scheduler, driven in-process
  (andante.vllm.replay) on the same Azure conversation-trace requests, make the same
  decision every step (tokens per request, preemptions), with and without prefix
  caching (prompts sharing a prefix);
- policies: every policy the adapter runs serves a bursty code-trace replay to the
  end in a small KV cache, with andante's view and vLLM's state agreeing every step
  (running set, waiting order, blocks held + free == total);
- refusals: the startup errors for an unknown policy, unknown keys, bad options,
  async scheduling, an untested vLLM version.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any

from andante.vllm.config import POLICIES, ConfigError, check_version
from andante.vllm.replay import (
    ANDANTE_SCHEDULER,
    VLLM_SCHEDULER,
    build_scheduler,
    parse_args,
    replay,
)


def _args(model: str, trace: str, *extra: str) -> Namespace:
    return parse_args(["--model", model, "--trace", trace, *extra])


def equivalence(model: str, trace: str, *extra: str) -> dict[str, Any]:
    args = _args(model, trace, *extra)
    ours, _ = replay(args, ANDANTE_SCHEDULER, "vllm")
    theirs, _ = replay(args, VLLM_SCHEDULER, None)
    first_diff = next(({"ours": a, "vllm": b} for a, b in zip(ours, theirs, strict=False)
                       if a != b), None)
    return {"num_steps": [len(ours), len(theirs)], "first_diff": first_diff,
            "num_preemptions": sum(len(s["preempted"]) for s in theirs),
            "num_prefill_steps": sum(1 for s in theirs if max(s["tokens"].values(), default=0) > 1)}


def policy_run(model: str, trace: str, policy: str) -> dict[str, Any]:
    args = _args(model, trace, "--num-requests", "30", "--num-blocks", "160",
                 "--max-num-batched-tokens", "2048", "--step-seconds", "0.02",
                 "--max-steps", "6000")
    steps, sched = replay(args, ANDANTE_SCHEDULER, policy, check=True)
    errors = [f"step {s['step']}: {e}" for s in steps for e in s["errors"]]
    return {"num_steps": len(steps), "unfinished": sched.get_num_unfinished_requests(),
            "num_preemptions": sum(len(s["preempted"]) for s in steps),
            "mirrors_left": len(sched.mirrors), "errors": errors[:5],
            "free_blocks": sched.kv_view.num_free_device_blocks,
            "total_blocks": sched.kv_view.num_device_blocks}


def refusal(model: str, trace: str, andante: dict[str, Any], **fields: Any) -> str | None:
    """The ConfigError building andante's scheduler with these settings (None: none)."""
    try:
        build_scheduler(_args(model, trace), ANDANTE_SCHEDULER, andante, **fields)
    except ConfigError as exc:
        return str(exc)
    return None


def main() -> int:
    model, traces = sys.argv[1], sys.argv[2]
    conv = f"{traces}/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    code = f"{traces}/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
    out: dict[str, Any] = {
        "equivalence": equivalence(model, conv, "--num-requests", "40"),
        "equivalence_prefix": equivalence(model, conv, "--num-requests", "40",
                                          "--prefix-caching", "--shared-prefix", "200",
                                          "--num-blocks", "300"),
        "policies": {p: policy_run(model, code, p) for p in POLICIES},
    }
    try:
        check_version("0.31.0")
        out["version"] = None
    except ConfigError as exc:
        out["version"] = str(exc)
    out["refusals"] = {
        "policy": refusal(model, conv, {"policy": "nope"}),
        "key": refusal(model, conv, {"policy": "andes", "polcy": "x"}),
        "option": refusal(model, conv, {"policy": "andes", "policy_options": {"nope": 1}}),
        "async": refusal(model, conv, {"policy": "andes"}, async_scheduling=True),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
