"""`andante serve --upstream` / `--fleet` options, and the vLLM metric names andante's
own server exports."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from andante.cli.main import build_parser
from andante.cli.serve import fleet_options_from_args
from andante.runtime.upstream.discovery import FleetError
from tests.server.helpers import toy_server


def _options(*argv: str):  # type: ignore[no-untyped-def]
    return fleet_options_from_args(build_parser().parse_args(["serve", *argv]))


def test_upstreams_default_to_least_loaded() -> None:
    options = _options("--upstream", "http://a:1/v1", "--upstream", "http://b:2/")
    assert [u.url for u in options.upstreams] == ["http://a:1", "http://b:2"]
    assert options.fleet.router == "least-loaded"
    assert options.fleet.poll_interval == 0.5


def test_ascendra_names_the_last_upstreams_hp() -> None:
    options = _options("--upstream", "http://a:1", "--upstream", "http://b:2",
                       "--upstream", "http://c:3", "--router", "ascendra")
    assert [u.role for u in options.upstreams] == ["lp", "lp", "hp"]


def test_options_a_fleet_cannot_honour_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cache-aware matches prompt token blocks"):
        _options("--upstream", "http://a:1", "--router", "cache-aware")
    keys = tmp_path / "keys"
    keys.write_text("alice k1\n")
    with pytest.raises(ValueError, match="single-tenant"):
        _options("--upstream", "http://a:1", "--api-keys-file", str(keys))


def test_fleet_file_router_and_command_line_override(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('router = "qlm"\npoll_interval = 0.2\n'
                    '[[instances]]\nurl = "http://a:1"\nmax_num_seqs = 8\n')
    options = _options("--fleet", str(path))
    assert options.fleet.router == "qlm" and options.fleet.poll_interval == 0.2
    assert options.upstreams[0].max_num_seqs == 8
    assert _options("--fleet", str(path), "--router", "power-of-two").fleet.router == \
        "power-of-two"
    with pytest.raises(FleetError, match="cannot read fleet file"):
        _options("--fleet", str(tmp_path / "missing.toml"))


def test_andante_exports_vllm_load_names() -> None:
    with toy_server() as server:
        text = httpx.get(f"{server.url}/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f'vllm:{name}{{model_name="toy"}}' in text
        assert f'andante:{name}{{model_name="toy"}}' in text
