"""DESIGN.md §1 and §4 on the cluster layer: each paper in one home, one instance with two
clocks, and a simulator that needs no torch.

- No code branches on a router's name: what differs per router is in its entry of
  `andante.cluster.registry` (as the policies' registry).
- Every cluster operation's state machine is written once, under `andante/cluster/`:
  no module under `sim/` or `runtime/` defines a class of that name or a function named
  after one of its steps (the simulator and the runtime drive the one copy, each through
  the small site protocol it implements).
- `andante simulate` imports no torch (run in a subprocess where importing torch fails;
  and, slow, in a fresh virtual environment with numpy and highspy only).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from andante.cluster.registry import router_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "andante"
REGISTRY = PACKAGE / "cluster" / "registry.py"

#: The state machines of the cluster operations and the protocols of their sites.
MACHINES = {
    PACKAGE / "cluster" / "qlm" / "tiers.py": ("ModelTiers", "ModelSwap"),
    PACKAGE / "cluster" / "qlm" / "swap.py": ("ModelSwitcher",),
    PACKAGE / "cluster" / "kunserve" / "groups.py": ("PipelineGroupBook",),
    PACKAGE / "cluster" / "kunserve" / "exchange.py": ("ExchangeQueue",),
}
SITES = {
    PACKAGE / "cluster" / "qlm" / "swap.py": ("SwapSite",),
    PACKAGE / "cluster" / "kunserve" / "groups.py": ("GroupSite",),
    PACKAGE / "cluster" / "kunserve" / "seam.py": ("PipelineGroups",),
}
#: Names too generic to stand for a step of an operation (a site may use them, or
#: answer a seam's question with them by asking the machine).
GENERIC = {"check", "tier", "models", "due", "next_model", "at_boundary", "run", "done",
           "pending_ids", "leader_of", "accepting", "plans"}


def _modules(*areas: str) -> Iterator[Path]:
    for area in areas:
        yield from sorted((PACKAGE / area).rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _strings(node: ast.AST) -> list[str]:
    """The string constants `node` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for item in node.elts for s in _strings(item)]
    return []


def _router_name_uses(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += _strings(operand)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None:
                    found += _strings(key)
        elif isinstance(node, ast.MatchValue):
            found += _strings(node.value)
        for name in set(found) & names:
            yield getattr(node, "lineno", 0), name


def test_no_branch_on_a_router_name_outside_the_registry() -> None:
    names = set(router_names())
    branches = [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                for path in _modules(".") if path != REGISTRY
                for line, name in _router_name_uses(_tree(path), names)]
    assert not branches, "branch on a router name (use its registry entry):\n" + \
        "\n".join(branches)


def test_the_rule_sees_a_branch_on_a_router_name() -> None:
    code = 'if router == "kunserve" or name in ("qlm", "x"):\n    pass\nT = {"llumnix": 1}\n'
    found = {name for _, name in _router_name_uses(ast.parse(code), set(router_names()))}
    assert found == {"kunserve", "qlm", "llumnix"}


def _defined(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node


def _steps() -> tuple[set[str], set[str]]:
    """The machines' class names, and their steps: their public methods and their
    modules' public functions that no site protocol declares and that are not generic
    (a copy is caught with or without a leading underscore)."""
    classes: set[str] = set()
    steps: set[str] = set()
    declared = set(GENERIC)
    for path, names in SITES.items():
        for name, node in _defined(_tree(path)):
            if name in names and isinstance(node, ast.ClassDef):
                declared |= {n for n, _ in _defined(node)}
    for path, names in MACHINES.items():
        tree = _tree(path)
        steps |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
                  and not node.name.startswith("_")}  # the modules' own functions
        for name, node in _defined(tree):
            if name in names and isinstance(node, ast.ClassDef):
                classes.add(name)
                steps |= {n for n, _ in _defined(node) if not n.startswith("_")}
    return classes, steps - declared - classes


def test_machines_are_found() -> None:
    classes, steps = _steps()
    assert {"ModelTiers", "ModelSwap", "ModelSwitcher", "PipelineGroupBook"} <= classes
    assert {"park", "unpark", "release_parked", "swap", "flush", "activate", "warm"} <= steps
    assert {"units_of", "propose", "form", "restore", "moves_back", "evict_group", "shed",
            "link_load", "chunks"} <= steps


def test_one_copy_of_each_cluster_operation() -> None:
    classes, steps = _steps()
    everywhere = [(p, name) for p in _modules(".") for name, node in _defined(_tree(p))
                  if isinstance(node, ast.ClassDef) and name in classes]
    homes = {p for p, _ in everywhere}
    assert homes <= set(MACHINES), sorted(str(p.relative_to(ROOT)) for p in homes)
    copies = [f"{path.relative_to(ROOT)}:{node.lineno}: {name}"  # type: ignore[attr-defined]
              for path in _modules("sim", "runtime")
              for name, node in _defined(_tree(path))
              if name in classes or name.lstrip("_") in steps]
    assert not copies, "a sim/runtime copy of a cluster operation's step:\n" + \
        "\n".join(copies)


BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"the simulate path imported {name}")
            return None

    sys.meta_path.insert(0, NoTorch())
    from andante.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")

SIMULATE = ["simulate", "--num-requests", "6", "--no-progress", "--json",
            "--lengths", "fixed:64:8"]


@pytest.mark.parametrize("extra", [
    [], ["--router", "kunserve", "--instances", "2"], ["--router", "qlm"],
    ["--router", "ascendra", "--instances", "3"], ["--pp", "2"],
    ["--router", "llumnix", "--instances", "2"]])
def test_simulate_imports_no_torch(extra: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, *SIMULATE, *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"num_unfinished": 0' in done.stdout


@pytest.mark.slow
def test_simulate_runs_in_a_venv_without_torch(tmp_path: Path) -> None:
    """A fresh virtual environment with andante (`pip install --no-deps -e`), numpy and
    highspy only: `andante simulate` runs (pip reads the configured index)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "numpy", "highspy"], check=True, timeout=900)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True, timeout=900)
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0  # no torch here
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(venv / "bin" / "andante"), *SIMULATE, "--router", "kunserve",
                           "--instances", "2"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"num_unfinished": 0' in done.stdout
