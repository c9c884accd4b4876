"""Policy flags of `andante simulate`: typed options, preemption mode, the Ascendra router."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from andante.cli.main import build_parser, main
from andante.cli.simulate import cluster_from_args
from andante.cli.workload_args import workload_from_args
from andante.engine.policy import parse_options
from andante.sim import simulate
from andante.workload import build_workload


@dataclass(frozen=True, slots=True)
class _Options:
    limit: float | None = 3.0
    count: int = 4
    flag: bool = False
    mode: str = "a"


def test_options_are_read_by_their_declared_type() -> None:
    opts = parse_options(_Options, {"limit": "None", "count": "7", "flag": "true", "mode": 5},
                         "p")
    assert opts == _Options(limit=None, count=7, flag=True, mode="5")
    assert parse_options(_Options, {"limit": "null", "count": 2.0}, "p").count == 2
    assert parse_options(_Options, {"limit": 1}, "p").limit == 1.0


@pytest.mark.parametrize(("values", "message"), [
    ({"limit": "abc"}, "option limit='abc': expected float or none"),
    ({"count": "none"}, "option count='none': expected int"),
    ({"count": 2.5}, "option count=2.5: expected int"),
    ({"flag": "maybe"}, "option flag='maybe': expected bool"),
    ({"mode": None}, "option mode=None: expected str"),
    ({"nope": 1}, r"unknown option\(s\) \['nope'\]"),
])
def test_bad_option_values_are_refused_in_one_line(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(_Options, values, "p")


@pytest.mark.parametrize("argv", [
    ["--policy", "fastserve", "--policy-option", "starve_limit=abc"],
    ["--policy", "andes", "--policy-option", "delta_t=abc"],
    ["--compare", "vllm,andes", "--policy-option", "delta_t=1"],  # vllm has no delta_t
])
def test_cli_refuses_bad_options_before_any_run(
    argv: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--num-requests", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: policy" in err


def test_none_is_accepted_where_the_option_allows_it(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--no-progress", "--policy", "fastserve", "--num-requests", "3",
            "--lengths", "fixed:50:5", "--policy-option", "starve_limit=None"]
    assert main(argv) == 0
    assert "completed" in capsys.readouterr().out


def _swaps(policy: str, mode: str | None) -> int:
    argv = ["simulate", "--hardware", "a10-24g", "--policy", policy, "--num-requests", "40",
            "--rate", "50", "--lengths", "fixed:1500:600", "--max-model-len", "4096"]
    args = build_parser().parse_args(argv + (["--preemption-mode", mode] if mode else []))
    run = simulate(cluster_from_args(args, policy), build_workload(workload_from_args(args)))
    assert run.summary.mean_preemptions > 0  # memory binds: the mode matters
    return sum(r.timeline.num_swaps_out for r in run.requests)


@pytest.mark.parametrize("policy", ["andes", "fastserve"])
def test_preemption_mode_is_honoured(policy: str) -> None:
    assert _swaps(policy, None) > 0  # their own choice: swap when it pays
    assert _swaps(policy, "recompute") == 0


def test_preemption_mode_against_a_policy_option_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--policy", "fastserve", "--preemption-mode", "swap",
            "--policy-option", "kv_mode=recompute"]
    assert main(argv) == 2
    assert "contradicts --policy-option kv_mode=recompute" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--hp-instances", "2", "--instances", "4", "--compare", "vllm,sjf"], "drop --policy"),
    (["--policy", "no-such-policy", "--instances", "3"], "drop --policy"),
    (["--instances", "1"], "needs 1 <= hp_instances < instances, got 1 of 1"),
    (["--instances", "2", "--hp-instances", "2"], "hp_instances < instances, got 2 of 2"),
])
def test_ascendra_router_refuses_what_it_would_ignore(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--router", "ascendra", "--num-requests", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ascendra_run_is_labelled_and_takes_pool_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "--no-progress", "--router", "ascendra", "--instances", "3",
            "--num-requests", "4", "--lengths", "fixed:50:5"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("hardware profile: ")
    assert lines[2].split() == ["metric", "ascendra"]
    assert main([*argv, "--policy-option", "lp.chunk=maybe"]) == 2
    assert "option chunk='maybe': expected bool" in capsys.readouterr().err
