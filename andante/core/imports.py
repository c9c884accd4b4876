"""Registries name classes and functions as "package.module:name" strings, imported on
demand."""

from __future__ import annotations

import importlib
from typing import Any


def load_attr(target: str) -> Any:
    """What `target` ("package.module:name") names."""
    module_name, _, name = target.partition(":")
    return getattr(importlib.import_module(module_name), name)


def load_class(target: str) -> type:
    """The class that `target` ("package.module:Class") names."""
    cls: type = load_attr(target)
    return cls
