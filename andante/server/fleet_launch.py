"""Run the fleet server (andante.server.fleet_app): check the upstreams, then serve.

The port is bound first (a busy port fails at once), then every upstream is asked for
its models: an unreachable one, one serving no model, or a model under two names stops
the start with one line (`FleetError`).
"""

from __future__ import annotations

import asyncio

import uvicorn

from andante.runtime.gc_heap import freeze_heap
from andante.runtime.upstream.discovery import FleetError, discover
from andante.runtime.upstream.fleet import Fleet
from andante.server.fast_protocol import fast_protocol
from andante.server.fleet_app import FleetApp, FleetServeOptions, create_fleet_app
from andante.server.listen import ThreadedServer, bind, log_to_stderr


def _server(app: FleetApp, options: FleetServeOptions) -> uvicorn.Server:
    config = uvicorn.Config(
        app.front, log_level=options.log_level, timeout_graceful_shutdown=5, access_log=False,
        timeout_keep_alive=30, lifespan="on", http=fast_protocol(options.limits))
    return uvicorn.Server(config)


def build_fleet_app(options: FleetServeOptions) -> FleetApp:
    """The app over the discovered upstreams (FleetError on bad input)."""
    infos = asyncio.run(discover(options.upstreams, options.discovery_timeout))
    return create_fleet_app(options, infos)


def serve_fleet(options: FleetServeOptions) -> int:
    """Serve until interrupted; raises FleetError or PortUnavailable before serving."""
    log_to_stderr(options.log_level)
    sock = bind(options.host, options.port)
    try:
        app = build_fleet_app(options)
    except FleetError:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    fleet = app.fleet
    print(f"andante: serving {', '.join(fleet.models)} on http://{host}:{port} from "
          f"{len(fleet.upstreams)} upstream(s) (router {options.fleet.router}; metrics at "
          "/metrics, upstreams at /api/stats)", flush=True)
    freeze_heap()  # start-up objects: never walked again (andante.runtime.gc_heap)
    _server(app, options).run(sockets=[sock])
    return 0


class FleetServerThread(ThreadedServer):
    """A live fleet server on 127.0.0.1 in a background thread (tests, benchmarks)."""

    def __init__(self, options: FleetServeOptions) -> None:
        sock = bind(options.host, options.port)
        self.app = build_fleet_app(options)
        super().__init__(sock, _server(self.app, options), "andante-fleet")

    @property
    def fleet(self) -> Fleet:
        return self.app.fleet
