"""Fixtures for the workload tests: a seeded generator and the shared traces folder."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from andante.workload.builder import SHAREGPT_FILE, TRACE_FILES, TRACES_ENV_VAR

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """../shared/traces beside the repository (or $ANDANTE_TRACES); skips if absent."""
    folder = Path(os.environ.get(TRACES_ENV_VAR) or REPO_ROOT.parent / "shared" / "traces")
    needed = [folder / SHAREGPT_FILE, *(folder / name for name in TRACE_FILES.values())]
    if not all(path.is_file() for path in needed):
        pytest.skip(f"traces not found under {folder}")
    return folder


@pytest.fixture(scope="session")
def conv_trace(traces_dir: Path) -> Path:
    return traces_dir / TRACE_FILES["azure-conv"]


@pytest.fixture(scope="session")
def sharegpt_csv(traces_dir: Path) -> Path:
    return traces_dir / SHAREGPT_FILE
