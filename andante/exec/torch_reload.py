"""Weights reloaded after a level-2 sleep (andante.exec.torch_executor's sleep mode),
shared by the executors that wake together.

In-process instances of one server share the `LoadedModel` loaded at start-up; a level-2
sleep drops every executor's reference to it, and each wakes on its own stepping thread.
Loading the checkpoint once per executor would hold one copy per instance where there
was one before, so a wake-up takes the copy another executor reloaded from the same
file in the same dtype while any executor still holds it (a weak map), and loads it
otherwise.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

import torch

from andante.models.loader import load_model
from andante.models.weights import ModelWeights


class ReloadedWeights:
    """A reloaded checkpoint's weights; an executor holds it while it uses them."""

    __slots__ = ("weights", "__weakref__")

    def __init__(self, weights: ModelWeights) -> None:
        self.weights = weights


_reloaded: weakref.WeakValueDictionary[tuple[str, torch.dtype], ReloadedWeights] = (
    weakref.WeakValueDictionary())
_lock = threading.Lock()


def reload_weights(path: Path, dtype: torch.dtype) -> ReloadedWeights:
    """The weights of the checkpoint at `path` in `dtype`: the copy an awake executor
    already holds, else loaded now."""
    key = (str(path), dtype)
    with _lock:
        found = _reloaded.get(key)
        if found is None:
            found = ReloadedWeights(load_model(path, dtype).weights)
            _reloaded[key] = found
        return found
