"""Where andante keeps its files on disk, and how its on/off switches are read.

This is the one place that reads the `ANDANTE_HOME` environment variable; everything
else asks these functions. `env_switch` reads the `ANDANTE_NO_*` / `ANDANTE_REPROBE_*`
switches one way: set to anything but "" or "0" means on.
"""

from __future__ import annotations

import os
from pathlib import Path

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
