from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from andante.server import ServerThread
from tests.server.helpers import toy_server

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    """One toy server shared by a module's tests (they must leave it idle)."""
    with toy_server() as srv:
        yield srv
