"""benchmarks/sim_speed.py reports every workload of issue 30 item 7 for each policy."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchmarks.scripts import BENCHMARKS, load_script


def test_every_workload_is_reported_for_each_policy(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script(BENCHMARKS / "sim_speed.py", register=True)
    monkeypatch.setattr(sys, "argv", ["sim_speed.py", "--num-requests", "12",
                                      "--policies", "vllm,fastserve"])
    script.main()
    out = json.loads(capsys.readouterr().out)
    assert out["workloads"] == ["sharegpt", "long", "conversation", "pressure"]
    for name in out["workloads"]:
        assert set(out["results"][name]) == {"vllm", "fastserve"}
        assert all(r["completed"] == 12 for r in out["results"][name].values())
