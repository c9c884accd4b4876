"""`andante calibrate`: prints and stores the fit error, keeps the profile it replaces,
refuses a poor fit unless --force; `andante simulate` names the profile and its error.

The fit itself is faked (the real sweep takes minutes); what happens to it is real:
profiles are written to and read from a temporary ANDANTE_HOME."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from andante.cli import calibrate as calibrate_cli
from andante.cli.calibrate import MAX_FIT_ERROR, keep_previous, save_fit
from andante.cli.main import main
from andante.perf.catalog import describe_hardware, get_hardware, save_hardware
from andante.perf.paths import ANDANTE_HOME_ENV, hardware_profiles_dir
from andante.perf.specs import HardwareSpec


def _fit(name: str = "cpu", flops: float = 1e11) -> HardwareSpec:
    return HardwareSpec(name=name, peak_flops=flops, mem_bandwidth=2e10, mem_capacity=1 << 34,
                        host_link_bandwidth=1e10, interconnect_bandwidth=1e10,
                        collective_latency=0.0)


def _names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def test_the_replaced_profile_is_kept_under_a_dated_name(tmp_path: Path) -> None:
    assert keep_previous("cpu", tmp_path) is None
    old = _fit()
    save_hardware(old, tmp_path)
    dated = keep_previous("cpu", tmp_path)
    assert dated is not None and re.fullmatch(r"cpu-\d{8}-\d{6}", dated)
    assert get_hardware(dated, tmp_path) == dataclasses.replace(old, name=dated)
    assert get_hardware("cpu", tmp_path) == old  # still there until the new one is saved
    again = keep_previous("cpu", tmp_path)  # the same second: a name of its own
    assert again is not None and again != dated and len(_names(tmp_path)) == 3


def test_a_good_fit_is_saved_with_its_error_and_the_old_one_kept(tmp_path: Path) -> None:
    save_hardware(_fit(flops=5e10), tmp_path)
    outcome = save_fit(_fit(), 0.07, profiles_dir=tmp_path)
    assert not outcome.refused and outcome.message is None
    saved = get_hardware("cpu", tmp_path)
    assert saved.peak_flops == 1e11 and saved.fit_error == 0.07 and saved.calibrated_at
    assert outcome.previous is not None
    assert get_hardware(outcome.previous, tmp_path).peak_flops == 5e10


def test_a_poor_fit_is_refused_and_the_profile_in_place_stays(tmp_path: Path) -> None:
    save_fit(_fit(flops=5e10), 0.05, profiles_dir=tmp_path)
    before = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    outcome = save_fit(_fit(), 0.41, profiles_dir=tmp_path)
    assert outcome.refused and outcome.saved_to is None and outcome.previous is None
    assert outcome.message is not None and "41.0%" in outcome.message
    assert "fit error 5.0%" in outcome.message  # names the profile that stays
    assert {p.name: p.read_text() for p in tmp_path.glob("*.json")} == before


def test_force_saves_a_poor_fit_with_a_warning(tmp_path: Path) -> None:
    save_fit(_fit(flops=5e10), 0.05, profiles_dir=tmp_path)
    outcome = save_fit(_fit(), 0.41, MAX_FIT_ERROR, force=True, profiles_dir=tmp_path)
    assert not outcome.refused and outcome.previous is not None
    assert outcome.message is not None and "--force" in outcome.message
    assert get_hardware("cpu", tmp_path).fit_error == 0.41
    assert save_fit(_fit(), 0.2, 0.25, profiles_dir=tmp_path).saved_to is not None


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    outcome = save_fit(_fit(), 0.3, dry_run=True, profiles_dir=tmp_path)
    assert not outcome.refused and outcome.saved_to is None and outcome.message
    assert _names(tmp_path) == []


@pytest.fixture
def fake_sweep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """`andante calibrate` with the measured sweep replaced by fits of the errors queued
    in the returned list; profiles go to a temporary ANDANTE_HOME."""
    from andante.exec.torch_calibrate import Calibration

    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path))
    errors: list[float] = []

    def measure(args: argparse.Namespace) -> tuple[str, Calibration]:
        return "fake-model", Calibration(_fit(args.name), [], errors.pop(0))

    monkeypatch.setattr(calibrate_cli, "_measure", measure)
    return errors


def test_the_command_refuses_then_forces(fake_sweep: list[float],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    fake_sweep += [0.06, 0.38, 0.38]
    assert main(["calibrate"]) == 0
    assert "mean |error| of the fit 6.0%" in capsys.readouterr().out
    assert main(["calibrate", "--json"]) == 1
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["refused"] and record["saved_to"] is None and record["fit_error"] == 0.38
    assert captured.err.startswith("error: not saved")
    assert get_hardware("cpu").fit_error == 0.06
    assert main(["calibrate", "--force"]) == 0
    assert get_hardware("cpu").fit_error == 0.38
    assert len(_names(hardware_profiles_dir())) == 2  # cpu and the dated 6% fit


def test_bad_max_error_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--max-error", "-1"])
    assert exit_info.value.code == 2
    assert "must be a fraction" in capsys.readouterr().err


def test_simulate_names_the_profile_and_its_error(
    fake_sweep: list[float], capsys: pytest.CaptureFixture[str],
) -> None:
    fake_sweep.append(0.073)
    assert main(["calibrate"]) == 0
    assert "fit error 7.3%" in describe_hardware("cpu")
    capsys.readouterr()
    argv = ["simulate", "--no-progress", "--hardware", "cpu", "--model", "smollm2-135m",
            "--num-requests", "3", "--lengths", "uniform:16:32:4:8"]
    assert main(argv) == 0
    profile_line = capsys.readouterr().out.splitlines()[1]
    assert profile_line.startswith("hardware profile: cpu (saved ")
    assert "fit error 7.3%" in profile_line
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile_fit_error"] == 0.073
    assert "built-in" in describe_hardware("a100-80g")
