"""The rules of issue 24's policy half: a slim `Policy` contract with the simulator's
fast paths apart, Andes in at most four modules walked without re-entry, policies that
ask the block manager for block counts and watermarks, one `ModelSpec`, one running
mean."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

from andante.engine.fast_path import FastPathDefaults, SimFastPath
from andante.engine.policy import BasePolicy, Policy
from tests.benchmarks.scripts import load_benchmark

PACKAGE = Path(__file__).resolve().parents[2] / "andante"
POLICIES = PACKAGE / "policies"
ANDES = POLICIES / "andes"

#: What a policy must answer to schedule a step (DESIGN.md §2.4; engine/policy.py).
POLICY_MEMBERS = {"name", "chunks_prefill", "schedule", "on_arrival", "on_finish",
                  "on_step_end"}
#: Andes' algorithm modules (options.py holds its tunables, __init__.py its exports).
ANDES_MODULES = {"policy.py", "qoe.py", "knapsack.py", "refiner.py"}


def _protocol_members(protocol: type) -> set[str]:
    names = set(typing.get_type_hints(protocol)) | {
        n for n, v in vars(protocol).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def _trees(folder: Path) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(folder.rglob("*.py"))}


def test_the_policy_contract_is_what_a_step_needs() -> None:
    assert _protocol_members(Policy) == POLICY_MEMBERS


def test_the_fast_paths_are_a_separate_protocol_with_defaults() -> None:
    fast = _protocol_members(SimFastPath)
    assert fast and not fast & POLICY_MEMBERS
    assert fast <= set(dir(FastPathDefaults))  # every member has its "no run" answer
    assert not fast & set(dir(BasePolicy))  # a plain policy does not declare runs


def test_policies_never_import_the_simulator_or_the_layers_above() -> None:
    """Even under TYPE_CHECKING (the import graph test skips those blocks)."""
    forbidden = ("andante.sim", "andante.cluster", "andante.runtime", "andante.server",
                 "andante.cli", "andante.llm")
    found = []
    for path, tree in _trees(POLICIES).items():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith(forbidden)]
    assert not found, found


def _is_ceil_division(node: ast.AST) -> bool:
    """`-(-x // y)`."""
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.BinOp)
            and isinstance(node.operand.op, ast.FloorDiv)
            and isinstance(node.operand.left, ast.UnaryOp)
            and isinstance(node.operand.left.op, ast.USub))


def _names(node: ast.AST) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, ast.Attribute | ast.Name)}


def test_policies_ask_the_block_manager_for_block_arithmetic() -> None:
    """No ceiling division, no token/block conversion by the block size, no subtraction
    of the watermark: the block manager answers those (DESIGN.md §2.6)."""
    found = []
    for path, tree in _trees(POLICIES).items():
        for node in ast.walk(tree):
            where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}"
            if _is_ceil_division(node):
                found.append(f"{where}: -(-x // y)")
            if not isinstance(node, ast.BinOp):
                continue
            operands = _names(node.left) | _names(node.right)
            if isinstance(node.op, ast.FloorDiv | ast.Div | ast.Mult | ast.Mod) and (
                    {"block_size", "bs"} & operands):
                found.append(f"{where}: arithmetic with the block size")
            if isinstance(node.op, ast.Sub) and "watermark_blocks" in _names(node.right):
                found.append(f"{where}: subtracts the watermark")
    assert not found, "\n".join(found)


def test_andes_is_at_most_four_modules_and_one_class() -> None:
    modules = {p.name for p in ANDES.glob("*.py")} - {"__init__.py", "options.py"}
    assert modules <= ANDES_MODULES, sorted(modules)
    options = ast.parse((ANDES / "options.py").read_text())
    assert not [n.name for n in options.body if isinstance(n, ast.FunctionDef)], \
        "options.py holds only the tunables' dataclass"
    from andante.policies.andes import AndesPolicy
    own = [c for c in inspect.getmro(AndesPolicy)
           if c.__module__.startswith("andante.policies.andes")]
    assert own == [AndesPolicy]  # no mixins split over other files


def test_one_andes_decision_never_reenters_the_policy() -> None:
    """The traced walk of one `schedule` call where the knapsack and the refiner run
    (benchmarks/andes_walk.py): helpers never call back into the policy, and it passes
    through Andes' modules and the shared loops only."""
    walk = load_benchmark("andes_walk")
    engine, _ = walk.scenario()
    figures = walk.walk_one_decision(engine)
    assert figures["num_solves_in_walk"] == 1
    assert figures["helper_calls_into_policy"] == 0
    assert figures["policy_module_reentries"] == 0
    entered = {m.rsplit(".", 1)[-1] + ".py" for m in figures["module_list"]
               if m.startswith("andante.policies.andes.")}
    assert entered <= ANDES_MODULES
    assert figures["policy_modules"] <= len(ANDES_MODULES) + 1  # (+ phases.py)


def _classes(name: str) -> list[str]:
    found = []
    for path, tree in _trees(PACKAGE).items():
        found += [f"{path.relative_to(PACKAGE)}:{n.name}" for n in ast.walk(tree)
                  if isinstance(n, ast.ClassDef) and n.name == name]
    return found


def test_one_model_spec() -> None:
    assert _classes("ModelSpec") == ["perf/specs.py:ModelSpec"]
    assert _classes("ModelConfig") == []


def test_one_running_mean() -> None:
    """A class that keeps a count and a total to report their mean is RunningMean."""
    means = []
    for path, tree in _trees(PACKAGE).items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            assigned = {t.attr for n in ast.walk(cls) if isinstance(n, ast.AugAssign)
                        for t in [n.target] if isinstance(t, ast.Attribute)}
            methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
            if "mean" in methods and {"_count", "_total"} <= assigned:
                means.append(f"{path.relative_to(PACKAGE)}:{cls.name}")
    assert means == ["metrics/stats.py:RunningMean"]
