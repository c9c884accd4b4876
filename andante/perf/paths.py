"""Where andante keeps its files on disk, and how its on/off switches are read.

This is the one place that reads the `ANDANTE_HOME` environment variable; everything
else asks these functions. `env_switch` reads the `ANDANTE_NO_*` / `ANDANTE_REPROBE_*`
switches one way: set to anything but "" or "0" means on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ANDANTE_HOME_ENV = "ANDANTE_HOME"


def env_switch(name: str) -> bool:
    """Whether the environment variable `name` is set to anything but "" or "0"."""
    return os.environ.get(name, "") not in ("", "0")


def andante_home() -> Path:
    """`$ANDANTE_HOME` if set and non-empty, else `~/.cache/andante`."""
    value = os.environ.get(ANDANTE_HOME_ENV, "")
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "andante"


def hardware_profiles_dir() -> Path:
    """Directory of saved hardware profiles (`<name>.json`), e.g. from calibration."""
    return andante_home() / "hardware"


def write_json_atomically(path: Path, entry: dict[str, Any]) -> None:
    """Write `entry` as JSON to `path` through a temporary file in its folder, so a
    concurrent reader sees the old file or the new one, never half of one (OSError on
    failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=1), encoding="utf-8")
    tmp.replace(path)
