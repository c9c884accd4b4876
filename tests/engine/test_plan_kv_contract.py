"""Every KV method that StepPlan calls exists on both KV views it runs over: andante's
block manager and the vLLM scheduler class's view of vLLM's KV cache manager (a method
added to one only fails at the first step on the other, inside a vLLM server)."""

from __future__ import annotations

import ast
import inspect

import andante.engine.plan as plan_module
from andante.kv.block_manager import KVBlockManager
from andante.vllm.kv_view import VllmKVView


def _kv_attributes_used() -> set[str]:
    """Attributes read off `self._kv` or a local `kv` in andante/engine/plan.py."""
    tree = ast.parse(inspect.getsource(plan_module))
    used = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        local = isinstance(base, ast.Name) and base.id == "kv"
        if local or (isinstance(base, ast.Attribute) and base.attr == "_kv"):
            used.add(node.attr)
    return used


def _answers(view: type, name: str) -> bool:
    """A method or property of the class, or an attribute its code sets on itself."""
    return hasattr(view, name) or f"self.{name} =" in inspect.getsource(view)


def test_both_kv_views_answer_every_call_of_the_plan() -> None:
    used = _kv_attributes_used()
    assert {"registers_more", "refuses_for_now", "num_free_device_blocks"} <= used
    for view in (KVBlockManager, VllmKVView):
        missing = sorted(name for name in used if not _answers(view, name))
        assert not missing, f"{view.__name__} lacks {missing}"
