"""Every policy andante.vllm runs answers OpenAI requests in a served vLLM CPU build,
greedy outputs token-identical to vLLM's own scheduler on the same prompts (`andes`
is tested at length in test_served.py). Servers start four at a time (slow: several
minutes on a shared 2-core machine).

The prompts go one at a time: a policy that batches differently from vLLM (FastServe's
MLFQ runs only its top queue's jobs in a step) changes the batch each decode runs in,
and bf16 GEMMs of another batch size round differently on the CPU, which can flip a
greedy token (seen: FastServe, 3 concurrent prompts, token 4 of one)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from andante.vllm.config import POLICIES
from tests.peers import VllmPeer
from tests.vllm.served import complete, start, stop, wait_ready

pytestmark = pytest.mark.slow

OTHERS = [p for p in POLICIES if p != "andes"]
DEFAULT = "vllm-default"
PROMPTS = ["The capital of France is", "def add(a, b):", "Three fruits are"]
AT_ONCE = 4  # servers started together (memory and the machine's 2 cores)


def _answers(url: str) -> list[dict]:
    return [complete(url, prompt, 16) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def answers(vllm_peer: VllmPeer, tmp_path_factory: pytest.TempPathFactory,
            ) -> dict[str, list[dict]]:
    workdir: Path = tmp_path_factory.mktemp("vllm-policies")
    names = [DEFAULT, *OTHERS]
    out: dict[str, list[dict]] = {}
    for first in range(0, len(names), AT_ONCE):
        batch = names[first:first + AT_ONCE]
        procs = {n: start(vllm_peer, workdir / f"{n}.log",
                          None if n == DEFAULT else {"policy": n, "log_interval": 0})
                 for n in batch}
        try:
            served = {n: wait_ready(p, workdir / f"{n}.log") for n, p in procs.items()}
            with ThreadPoolExecutor(len(served)) as pool:
                for name, result in zip(served, pool.map(
                        lambda s: _answers(s.url), served.values()), strict=True):
                    out[name] = result
        finally:
            for proc in procs.values():
                stop(proc)
    return out


@pytest.mark.parametrize("policy", OTHERS)
def test_policy_answers_with_vllms_greedy_tokens(answers: dict[str, list[dict]],
                                                 policy: str) -> None:
    for ours, theirs in zip(answers[policy], answers[DEFAULT], strict=True):
        assert ours["choices"][0]["token_ids"] == theirs["choices"][0]["token_ids"]
        assert ours["usage"] == theirs["usage"]  # the same stop (EOS or the 16 asked)
