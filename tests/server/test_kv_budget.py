"""The default KV pool: sized from the model and the machine, with its reason."""

from __future__ import annotations

import pytest

from andante.server.kv_budget import GIB, KV_MEMORY_SHARE, plan_kv


def test_a_small_model_gets_every_sequence_at_full_context() -> None:
    budget = plan_kv(1000, 2048, 4, available=64 * GIB)
    assert budget.num_tokens == 4 * 2048
    assert "4 sequences x 2048 tokens" in budget.describe()


def test_a_large_need_is_capped_by_the_available_memory() -> None:
    budget = plan_kv(46 * 1024, 8192, 64, available=16 * GIB)
    assert budget.num_tokens == int(KV_MEMORY_SHARE * 16 * GIB) // (46 * 1024)
    assert budget.gib <= KV_MEMORY_SHARE * 16 + 1e-9
    assert "5% of the 16.0 GiB" in budget.describe()


def test_at_least_one_full_context() -> None:
    budget = plan_kv(1 << 20, 8192, 64, available=8 * GIB)  # 0.8 GiB < one context
    assert budget.num_tokens == 8192
    assert "one full context" in budget.reason


def test_unknown_memory_uses_one_gib() -> None:
    budget = plan_kv(1024, 8192, 1024, available=None)
    assert budget.num_tokens == GIB // 1024


def test_bytes_per_token_must_be_positive() -> None:
    with pytest.raises(ValueError, match="bytes_per_token must be >= 1, got 0"):
        plan_kv(0, 2048, 4, available=GIB)
