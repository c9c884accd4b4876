"""Sampling: greedy, temperature, top-k/top-p masks, seeded reproducibility."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.core import Request, SamplingParams
from andante.exec.torch_sampler import ARGMAX_BLOCK, Sampler, filter_top_k_top_p, first_argmax


def _req(rid: str = "r", **params: object) -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(**params), 0.0)  # type: ignore[arg-type]


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = filter_top_k_top_p(logits, torch.tensor([2]), None)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]
    assert out[0, 1] == 5.0 and out[0, 3] == 4.0


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    keep = lambda p: torch.isfinite(filter_top_k_top_p(logits, None, torch.tensor([p])))[0]  # noqa: E731
    assert keep(0.45).tolist() == [True, False, False, False]
    assert keep(0.6).tolist() == [True, True, False, False]
    assert keep(0.9).tolist() == [True, True, True, False]
    assert keep(1.0).all()


def test_rows_filter_independently() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    out = filter_top_k_top_p(logits, torch.tensor([1, 3]), torch.tensor([1.0, 1.0]))
    assert torch.isfinite(out).tolist() == [[False, False, True], [True, True, True]]


def test_greedy_takes_the_argmax() -> None:
    logits = torch.randn(3, 50)
    reqs = [_req(temperature=0.0), _req(top_k=1), _req(temperature=0.0)]
    assert Sampler().sample(logits, reqs) == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    logits = torch.randn(1, 1000)
    seeded = _req("a", temperature=1.0, seed=7)
    first = Sampler(seed=1).sample(logits, [seeded])
    with_others = Sampler(seed=2).sample(torch.cat([torch.randn(1, 1000), logits]),
                                         [_req("b", temperature=1.0), seeded])
    assert first == with_others[1:]
    seeded.append_output_token(first[0], 0.0)  # the next token draws fresh noise
    draws = {Sampler().sample(logits, [seeded])[0] for _ in range(3)}
    assert len(draws) == 1


def test_unseeded_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log().expand(4000, 3).contiguous()
    reqs = [_req(str(i), temperature=1.0) for i in range(4000)]
    counts = torch.bincount(torch.tensor(Sampler(seed=0).sample(logits, reqs)), minlength=3)
    assert torch.allclose(counts / 4000, probs, atol=0.03)


def test_temperature_sharpens() -> None:
    logits = torch.tensor([1.0, 0.0]).expand(2000, 2).contiguous()
    cold = [_req(str(i), temperature=0.1) for i in range(2000)]
    hot = [_req(str(i), temperature=10.0) for i in range(2000)]
    assert sum(Sampler(0).sample(logits, cold)) < 10  # nearly always token 0
    assert 800 < sum(Sampler(0).sample(logits, hot)) < 1200  # close to a coin flip


def test_top_k_restricts_samples() -> None:
    logits = torch.arange(10.0).expand(500, 10).contiguous()
    reqs = [_req(str(i), temperature=5.0, top_k=3) for i in range(500)]
    assert set(Sampler(0).sample(logits, reqs)) <= {7, 8, 9}


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 3 * ARGMAX_BLOCK + 7),
       ties=st.lists(st.integers(0, 10**6), max_size=4), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.bfloat16, torch.float32]))
def test_first_argmax_is_torch_argmax_ties_included(rows: int, vocab: int, ties: list[int],
                                                   seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen).to(dtype)
    for i, where in enumerate(ties):  # equal maxima in several places, blocks included
        logits[i % rows, where % vocab] = 50.0
    assert torch.equal(first_argmax(logits), logits.float().argmax(dim=-1))


def test_first_argmax_with_low_precision_ties_across_blocks() -> None:
    logits = torch.full((2, 5 * ARGMAX_BLOCK), -1.0, dtype=torch.bfloat16)
    logits[0, [3 * ARGMAX_BLOCK + 5, ARGMAX_BLOCK + 9, 4 * ARGMAX_BLOCK]] = 7.0
    logits[1, -1] = 2.0
    assert first_argmax(logits).tolist() == [ARGMAX_BLOCK + 9, 5 * ARGMAX_BLOCK - 1]
