"""Registries name classes as "package.module:Class" strings, imported on demand."""

from __future__ import annotations

import importlib


def load_class(target: str) -> type:
    """The class that `target` ("package.module:Class") names."""
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]
