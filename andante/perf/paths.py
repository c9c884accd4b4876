"""Where andante keeps its files on disk.

This is the one place that reads the `ANDANTE_HOME` environment variable; everything
else asks these functions.
"""

from __future__ import annotations

import os
from pathlib import Path

ANDANTE_HOME_ENV = "ANDANTE_HOME"


def andante_home() -> Path:
    """`$ANDANTE_HOME` if set and non-empty, else `~/.cache/andante`."""
    value = os.environ.get(ANDANTE_HOME_ENV, "")
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "andante"


def hardware_profiles_dir() -> Path:
    """Directory of saved hardware profiles (`<name>.json`), e.g. from calibration."""
    return andante_home() / "hardware"
