"""The seam between KunServe's coordinator (pure logic) and whatever runs instances.

Design note (KunServe §4, DESIGN.md §4): the coordinator decides *which* instances merge
into a pipeline group and which contiguous slice of layers each member keeps (its
Figure 6 greedy plan); a `PipelineGroups` implementation carries the decision out on
simulated instances (andante.sim) or on in-process engines (andante.runtime). Both obey
the same contract, so one coordinator drives the simulator and the server.

Contract of `form_group(plan)`:
- `plan.members` are instance indexes in stage order; member k keeps layers
  `plan.layer_slices[k]` = [start, end), the slices are contiguous, disjoint and cover
  every layer. The members may already belong to groups (merging groups re-forms them).
- The weight memory of the dropped layers becomes KV blocks: the group has one block
  manager whose device tier grows accordingly (`KVBlockManager.resize_device`).
- The group's leader (`members[0]`) serves every request the members held from then on;
  the other members report `accepting=False` to routers until the group dissolves.
  Running requests keep their progress: their KV for the layers a member dropped moves
  to the member that now holds those layers (`kv_mode="exchange"`, chunked, activations
  first) or is recomputed (`kv_mode="recompute"`). No request is lost.
- It returns False (and changes nothing) when the plan cannot be carried out.

`dissolve_group(leader)` reloads the dropped layers (host copy or disk) while serving
continues, moves the KV back so every member holds all layers again, and gives each
member back an independent engine; requests stay where they run. Between the two a
group can grow (a plan that appends solo members to it, its leader first) and, where the
implementation offers `shrink_group(leader)` (the coordinator's `ShrinkingGroups`),
release its last member, which then serves alone. A member that fails
makes its partners restore; its requests are re-queued (not started) or failed with
a clear error (started), never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

KVMode = Literal["exchange", "recompute"]


@dataclass(frozen=True, slots=True)
class GroupPlan:
    members: tuple[int, ...]
    layer_slices: tuple[tuple[int, int], ...]
    kv_mode: KVMode = "exchange"

    def __post_init__(self) -> None:
        if len(self.members) != len(self.layer_slices) or len(self.members) < 1:
            raise ValueError("a group plan needs one layer slice per member")
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"a member appears twice in {self.members}")
        expected = 0
        for start, end in self.layer_slices:
            if start != expected or end <= start:
                raise ValueError(f"layer slices must be contiguous and non-empty: "
                                 f"{self.layer_slices}")
            expected = end

    @property
    def leader(self) -> int:
        return self.members[0]

    @property
    def num_layers(self) -> int:
        return self.layer_slices[-1][1]


class PipelineGroups(Protocol):
    """Carries out KunServe's plans on a set of instances (see the module contract)."""

    def form_group(self, plan: GroupPlan) -> bool: ...

    def dissolve_group(self, leader: int) -> bool: ...

    def groups(self) -> list[GroupPlan]: ...
