"""Look up models and hardware by name.

Hardware comes from the built-in table or, for any other name, from a saved profile
`<profiles_dir>/<name>.json` (a `HardwareSpec` with its fitted coefficients, e.g. the
`cpu` profile that `andante calibrate` writes). Built-in names always win.
"""

from __future__ import annotations

import re
from pathlib import Path

from andante.perf.hardware import BUILTIN_HARDWARE
from andante.perf.models import BUILTIN_MODELS
from andante.perf.paths import hardware_profiles_dir
from andante.perf.specs import HardwareSpec, ModelSpec

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PROFILE_SUFFIX = ".json"


def model_names() -> list[str]:
    return [spec.name for spec in BUILTIN_MODELS]


def get_model(name: str) -> ModelSpec:
    for spec in BUILTIN_MODELS:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(model_names())}")


def builtin_hardware_names() -> list[str]:
    return [spec.name for spec in BUILTIN_HARDWARE]


def _profiles_dir(profiles_dir: Path | None) -> Path:
    return profiles_dir if profiles_dir is not None else hardware_profiles_dir()


def _saved_profile_names(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(path.stem for path in directory.glob(f"*{PROFILE_SUFFIX}")
                  if _PROFILE_NAME.match(path.stem))


def hardware_names(profiles_dir: Path | None = None) -> list[str]:
    """Built-in hardware names, then the saved profiles found in `profiles_dir`."""
    builtin = builtin_hardware_names()
    saved = [n for n in _saved_profile_names(_profiles_dir(profiles_dir)) if n not in builtin]
    return builtin + saved


def _check_profile_name(name: str) -> None:
    if not _PROFILE_NAME.match(name):
        raise ValueError(f"invalid hardware name {name!r}: use letters, digits, '.', '_', '-'")


def get_hardware(name: str, profiles_dir: Path | None = None) -> HardwareSpec:
    """A built-in accelerator, or the profile saved as `<profiles_dir>/<name>.json`.

    `profiles_dir` defaults to `paths.hardware_profiles_dir()`.
    """
    for spec in BUILTIN_HARDWARE:
        if spec.name == name:
            return spec
    _check_profile_name(name)
    directory = _profiles_dir(profiles_dir)
    path = directory / f"{name}{PROFILE_SUFFIX}"
    if not path.is_file():
        valid = ", ".join(hardware_names(directory))
        raise ValueError(f"unknown hardware {name!r}; valid names: {valid} "
                         f"(saved profiles are read from {directory})")
    try:
        spec = HardwareSpec.from_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"bad hardware profile {path}: {exc}") from exc
    if spec.name != name:
        raise ValueError(f"hardware profile {path} is named {spec.name!r}, expected {name!r}")
    return spec


def save_hardware(spec: HardwareSpec, profiles_dir: Path | None = None) -> Path:
    """Write `spec` as `<profiles_dir>/<spec.name>.json` so `get_hardware` finds it."""
    if spec.name in builtin_hardware_names():
        raise ValueError(f"{spec.name!r} is a built-in hardware name; save the profile "
                         "under another name (built-ins are never read from disk)")
    _check_profile_name(spec.name)
    directory = _profiles_dir(profiles_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.name}{PROFILE_SUFFIX}"
    path.write_text(spec.to_json() + "\n", encoding="utf-8")
    return path


def describe_hardware(name: str, profiles_dir: Path | None = None) -> str:
    """Which profile `name` is and how far to trust it: built-in, or saved with the mean
    error of its calibration fit and, for a step-log fit, the shapes it covered (what
    `andante simulate` prints in its header)."""
    spec = get_hardware(name, profiles_dir)
    if name in builtin_hardware_names():
        return f"{name} (built-in, fitted to published and measured figures: hardware.py)"
    path = _profiles_dir(profiles_dir) / f"{name}{PROFILE_SUFFIX}"
    error = "fit error unknown" if spec.fit_error is None else \
        f"fit error {spec.fit_error:.1%}"
    when = f", calibrated {spec.calibrated_at}" if spec.calibrated_at else ""
    fitted_on = f"; fitted on {spec.fitted_on}" if spec.fitted_on else ""
    return f"{name} (saved {path}, {error}{when}{fitted_on})"
