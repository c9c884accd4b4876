"""Growing and shrinking a formed pipeline group on the torch engine (KunServe §4.1:
"the number of instances in a group adapts to the memory demand"; §4.4).

Design note. A group is one `PipelineExecutor` over contiguous layer slices, with one
block manager (the leader's): a block id names one slot on every stage. To add a member
(memory pressure rose: one more instance drops its other layers and lends its memory)
or to take one away (pressure fell: that instance may reload and serve alone), the
layers are re-split over the new member list (`regroup`). Each new stage gets its
slice's weights and a KV pool of the group's new block count; every layer's KV moves
from the stage that held it to the one that holds it now, block ids kept, so the
requests in flight continue where they were. Shrinking the block count first compacts
the blocks in use below the new count (the block manager's `resize_device` returns the
{old id: new id} map); the copy applies it. A stage whose slice and block count do not
change is kept as it is. The arithmetic is the unsplit model's on every split, so a
greedy generation that crosses a grow and a shrink stays token-identical.

On a CPU the "memory" is one process's: the bytes freed by dropped layers are
accounted (`group_num_blocks`), not remapped onto another device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from andante.exec.torch_pipeline import LayerSlice, PipelineExecutor, PipelineStage


def regroup(pipeline: PipelineExecutor, slices: Sequence[LayerSlice], num_device_blocks: int,
            relocated: Mapping[int, int] | None = None) -> None:
    """Run `pipeline` over `slices` (contiguous, covering every layer) with
    `num_device_blocks` blocks per stage from its next step, its KV carried over;
    `relocated`: the block manager's {old id: new id} map when the count shrank (call
    at a step boundary, after resizing the scheduler's block manager)."""
    old_stages = pipeline.stages
    num_host = min(s.kv.num_host_blocks for s in old_stages)
    stages = []
    for start, end in slices:
        layers = (start, end)
        same = next((s for s in old_stages if s.layers_range == layers
                     and s.kv.num_device_blocks == num_device_blocks), None)
        if same is not None and not relocated:
            stages.append(same)
            continue
        stage = PipelineStage(pipeline.model, pipeline.options, layers,
                              num_device_blocks, num_host, pipeline.max_model_len,
                              old_stages[0].epilogues)  # the group keeps one layer form
        _carry_kv(old_stages, stage, relocated or {})
        stages.append(stage)
    pipeline.replace_stages(stages)


def _carry_kv(old_stages: Sequence[PipelineStage], stage: PipelineStage,
              relocated: Mapping[int, int]) -> None:
    """Copy every layer of `stage` from the old stage that held it: the blocks below
    both counts in place, then the relocated ones to their new ids; the host tier."""
    start, _ = stage.layers_range
    kept = min(stage.kv.num_device_blocks, min(s.kv.num_device_blocks for s in old_stages))
    src_ids = torch.tensor(list(relocated), dtype=torch.long)
    dst_ids = torch.tensor(list(relocated.values()), dtype=torch.long)
    for i in range(stage.num_layers):
        layer = start + i
        old = next(s for s in old_stages if s.holds(layer))
        j = layer - old.layers_range[0]
        target = stage.kv.device[i]
        target[:, :kept].copy_(old.kv.device[j][:, :kept])
        if relocated:
            target.index_copy_(1, dst_ids, old.kv.device[j].index_select(1, src_ids))
        host = min(stage.kv.num_host_blocks, old.kv.num_host_blocks)
        stage.kv.host[i][:, :host].copy_(old.kv.host[j][:, :host])
