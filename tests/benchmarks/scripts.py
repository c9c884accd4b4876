"""Loading a benchmark script (not a package module) as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def load_script(path: Path, register: bool = False) -> ModuleType:
    """The script at `path` as a module named by its stem; its folder goes on sys.path
    (scripts import their neighbours). register: also put it in sys.modules (dataclasses
    look their module up there)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module."""
    return load_script(BENCHMARKS / f"{name}.py")
