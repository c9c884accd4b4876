"""`andante calibrate` keeps the profile it replaces and flags a poor fit."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from andante.cli.calibrate import MAX_FIT_ERROR, fit_warning, keep_previous
from andante.perf.catalog import get_hardware, save_hardware


def test_the_replaced_profile_is_kept_under_a_dated_name(tmp_path: Path) -> None:
    assert keep_previous("cpu", tmp_path) is None
    old = dataclasses.replace(get_hardware("a100-80g"), name="cpu")
    save_hardware(old, tmp_path)
    dated = keep_previous("cpu", tmp_path)
    assert dated is not None and re.fullmatch(r"cpu-\d{8}-\d{6}", dated)
    assert get_hardware(dated, tmp_path) == dataclasses.replace(old, name=dated)
    assert get_hardware("cpu", tmp_path) == old  # still there until the new one is saved


def test_a_poor_fit_is_flagged() -> None:
    assert fit_warning(MAX_FIT_ERROR, None) is None
    warning = fit_warning(0.41, "cpu-20260101-000000")
    assert warning is not None and "41%" in warning and "cpu-20260101-000000" in warning
