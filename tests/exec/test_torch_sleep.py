"""Sleep mode of the torch executor (andante.exec.base.Sleepable): the KV tensors and (level
2) the weights are really released, and a woken executor answers as before."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

import andante.exec.torch_executor as torch_executor
from andante.core import Request
from andante.exec.base import Sleepable
from andante.exec.batch import StepBatch
from andante.exec.torch_executor import TorchExecutor
from andante.exec.torch_layers import FusedLayer
from andante.models import load_model
from tests.exec.engine_helpers import run_engine, tiny_executor

PROMPTS = [[5, 17, 33, 200, 12], list(range(10, 60)), [7, 7, 7]]
NUM_TOKENS = 12


def _greedy(executor: TorchExecutor) -> list[list[int]]:
    requests, _ = run_engine(executor, PROMPTS, NUM_TOKENS)
    return [list(r.output_token_ids) for r in requests]


def _fresh(path: Path, dtype: str = "float32", layer_form: str = "plain") -> TorchExecutor:
    """An executor that alone holds its model (so dropping it frees the weights)."""
    return tiny_executor(load_model(path, dtype), dtype=dtype, layer_form=layer_form)


@pytest.mark.parametrize("dtype,form", [("float32", "plain"), ("bfloat16", "epilogue"),
                                        ("bfloat16", "plain")])
@pytest.mark.parametrize("level", [1, 2])
def test_greedy_outputs_identical_after_a_sleep_wake_cycle(
        tiny_llama: Path, level: int, dtype: str, form: str) -> None:
    executor = _fresh(tiny_llama, dtype, layer_form=form)
    assert isinstance(executor, Sleepable)
    before = _greedy(executor)
    executor.sleep(level)
    assert executor.sleeping == level
    executor.wake_up()
    assert executor.sleeping is None
    assert _greedy(executor) == before


def test_level_1_frees_the_kv_tensors_and_keeps_the_weights(tiny_llama: Path) -> None:
    executor = _fresh(tiny_llama)
    blocks = executor.num_kv_blocks(executor.options.block_size)
    device, host = weakref.ref(executor.kv.device), weakref.ref(executor.kv.host)
    weight = executor.runner.layers[0].w.qkv  # type: ignore[union-attr]
    executor.sleep(1)
    gc.collect()
    assert device() is None and host() is None  # no layer keeps a view of the old pools
    assert executor.kv.device.numel() == 0 and executor.kv.host.numel() == 0
    assert all(layer.pool.numel() == 0 for layer in executor.runner.layers)
    assert executor.runner.layers[0].w.qkv is weight  # type: ignore[union-attr]
    assert executor.num_kv_blocks(executor.options.block_size) == blocks
    executor.wake_up()
    assert executor.kv.device.shape[2] == blocks[0] and executor.kv.host.shape[2] == blocks[1]
    assert executor.runner.layers[0].pool.data_ptr() == executor.kv.layer(0).data_ptr()


def test_level_2_frees_the_packed_and_loaded_weights(tiny_llama: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    executor = _fresh(tiny_llama, "bfloat16", layer_form="epilogue")
    layer = executor.runner.layers[0]
    assert isinstance(layer, FusedLayer) and layer.shape.epilogues
    packed = weakref.ref(layer.weights.qkv)
    loaded = weakref.ref(executor.model.weights.layers[0].qkv)
    head = weakref.ref(executor.runner.lm_head.weight)
    pool = weakref.ref(executor.kv.device)
    del layer
    executor.sleep(2)
    gc.collect()
    assert packed() is None and loaded() is None and head() is None and pool() is None
    assert not executor.model.weights.layers
    with pytest.raises(RuntimeError, match="asleep"):
        executor.runner  # noqa: B018
    monkeypatch.setattr(torch_executor, "choose_layer_form",
                        lambda *a: pytest.fail("the layer form was timed again"))
    executor.wake_up()
    woken = executor.runner.layers[0]
    assert isinstance(woken, FusedLayer) and woken.shape.epilogues  # the start-up form
    assert executor.model.weights.layers[0].qkv.dtype == torch.bfloat16


def test_level_1_then_level_2_and_repeated_calls(tiny_llama: Path) -> None:
    executor = _fresh(tiny_llama)
    before = _greedy(executor)
    executor.sleep(1)
    executor.sleep(2)  # deepens the sleep: the weights go too
    assert executor.sleeping == 2 and not executor.model.weights.layers
    executor.sleep(1)  # no shallower than it is
    assert executor.sleeping == 2
    executor.wake_up()
    executor.wake_up()  # awake already: a no-op
    assert _greedy(executor) == before
    with pytest.raises(ValueError, match="level"):
        executor.sleep(3)


def test_execute_while_asleep_raises(tiny_llama: Path) -> None:
    executor = _fresh(tiny_llama)
    executor.sleep(1)
    with pytest.raises(RuntimeError, match="asleep .*wake"):
        executor.execute(StepBatch())


def test_reset_prefix_cache_forgets_every_cached_block(tiny_llama: Path) -> None:
    shared = list(range(10, 60))
    executor = _fresh(tiny_llama)
    requests, engine = run_engine(executor, [shared, shared + [3]], 4)
    kv = engine.scheduler.kv
    assert kv.num_cached_free_blocks > 0
    free = kv.num_free_device_blocks
    assert kv.reset_prefix_cache() > 0
    assert kv.num_cached_free_blocks == 0 and kv.num_free_device_blocks == free
    kv.check_invariants()
    probe = Request("again", shared, requests[0].sampling, 0.0)
    kv.track(probe)
    assert kv.lookup_prefix(probe) == 0  # no stale hit


def test_executors_waking_together_share_one_reloaded_copy(tiny_llama: Path) -> None:
    model = load_model(tiny_llama, "float32")
    first, second = tiny_executor(model), tiny_executor(model)  # one server's instances
    del model
    for executor in (first, second):
        executor.sleep(2)
    first.wake_up()
    second.wake_up()
    assert first.model.weights is second.model.weights  # one copy, as at start-up
    reloaded = weakref.ref(first.model.weights.layers[0].qkv)
    for executor in (first, second):
        executor.sleep(2)
    gc.collect()
    assert reloaded() is None  # nobody keeps the shared copy once all sleep again
    first.wake_up()
    assert first.model.weights.layers
