from __future__ import annotations

from collections.abc import Iterator

import pytest

from andante.server import ServerThread
from tests.server.helpers import toy_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with toy_server(toy_step_time=0.005) as srv:
        yield srv
