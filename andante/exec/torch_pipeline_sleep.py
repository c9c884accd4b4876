"""Sleep mode of the pipeline executor (KunServe's merged groups): vLLM's dev-mode sleep
(andante.exec.base.Sleepable) over the stages, as the unsplit torch executor does it.

Design note (andante.exec.torch_executor's sleep mode, per stage). Called on the engine's
stepping thread between steps, with the server drained (no microbatch in flight:
refused otherwise). `sleep` first stops the stages' workers: stage processes
(andante.exec.torch_pipeline_procs) hold the pools and weights they were started with,
so the next submit after `wake_up` starts new ones on the new pools and reloaded
weights (threads restart as cheaply). `sleep(1)` drops every stage's KV tensors, both tiers
(`KVPools.release`), and points each layer at the empty placeholders so that no view
keeps the old pools alive; `sleep(2)` also drops the stages' weights (their layers, the
first stage's embedding, the last one's norm and LM head) and the executor's reference
to the model's, then trims the heap. `wake_up()` allocates the KV tiers again with the
same shapes and, after level 2, reloads the checkpoint the model was loaded from (in its
load dtype; one copy shared with the executors that wake together,
andante.exec.torch_reload) and rebuilds each stage's layer slice in the layer form the
group chose at start-up. The block manager's prefix cache is reset by the caller
(andante.server.sleep): the KV behind it is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from andante.exec.malloc_tuning import release_freed_memory
from andante.exec.torch_reload import ReloadedWeights, reload_weights
from andante.models.weights import ModelWeights

if TYPE_CHECKING:
    from andante.exec.torch_executor import TorchExecutorOptions
    from andante.exec.torch_pipeline import PipelineStage
    from andante.models.loader import LoadedModel


class PipelineSleep:
    """The sleep-mode methods of `PipelineExecutor` (see the module note)."""

    stages: list[PipelineStage]
    model: LoadedModel
    options: TorchExecutorOptions
    max_model_len: int
    _fed: Mapping[int, object]  # the microbatches in flight
    sleeping: int | None = None
    _load_dtype: torch.dtype | None = None
    _reloaded: ReloadedWeights | None = None

    def sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        if self._fed:
            raise RuntimeError("the pipeline cannot sleep with microbatches in flight")
        self.close()  # the stages' workers: the next submit starts them on the new state
        if self.sleeping is None:
            for stage in self.stages:
                stage.kv.release()
                _bind_kv(stage)
        if level == 2 and self._load_dtype is None:
            self._load_dtype = self.model.weights.dtype
            for stage in self.stages:
                stage.layers, stage.embed, stage.lm_head = [], None, None
            empty = torch.empty(0, dtype=self._load_dtype)
            self.model = dataclasses.replace(self.model,
                                             weights=ModelWeights(empty, [], empty, empty))
            self._reloaded = None
        self.sleeping = max(level, self.sleeping or 0)
        release_freed_memory()

    def wake_up(self) -> None:
        if self.sleeping is None:
            return
        for stage in self.stages:
            stage.kv.restore()
        if self._load_dtype is not None:
            self._reloaded = reload_weights(self.model.path, self._load_dtype)
            self.model = dataclasses.replace(self.model, weights=self._reloaded.weights)
            for stage in self.stages:
                stage._init_weights(self.model, self.options, self.max_model_len,
                                    stage.epilogues)
            self._load_dtype = None
            release_freed_memory()  # the loader's temporary buffers
        else:
            for stage in self.stages:
                _bind_kv(stage)
        self.sleeping = None

    def close(self) -> None:
        """Stop the stages' workers (`PipelineExecutor.close`)."""
        raise NotImplementedError

    def _check_awake(self) -> None:
        if self.sleeping is not None:
            raise RuntimeError(
                f"the pipeline executor is asleep (level {self.sleeping}): its stages' "
                f"{'KV cache and weights are' if self.sleeping == 2 else 'KV cache is'} "
                "released; wake it up first (POST /wake_up)")


def _bind_kv(stage: PipelineStage) -> None:
    """Point the stage's layers at its KV pools' current tensors."""
    for i, layer in enumerate(stage.layers):
        layer.bind_kv(stage.kv.layer(i), stage.kv.layer_slots(i))
