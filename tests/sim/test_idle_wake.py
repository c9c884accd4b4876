"""The simulator's idle wake (a profile's `idle_wake` and `idle_wake_after`): a step that
an instance starts after running none for `idle_wake_after` seconds or more takes
`idle_wake` longer; a step that follows another at once, or a shorter idle gap, pays
nothing; a profile without it (every built-in) simulates exactly as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from andante.perf.catalog import get_hardware, save_hardware
from andante.perf.paths import ANDANTE_HOME_ENV
from andante.perf.specs import HardwareSpec
from andante.policies import SchedulerConfig
from andante.sim import ClusterSpec, simulate
from andante.workload import RequestSpec, WorkloadConfig, build_workload

BASE = get_hardware("a10-24g")
SPEC = ClusterSpec(model="smollm2-135m", hardware=BASE.name, policy="vllm",
                   scheduler=SchedulerConfig(max_num_seqs=8))
WORKLOAD = build_workload(WorkloadConfig(kind="poisson", rate=2.0, num_requests=24,
                                         lengths="uniform:32:256:8:48", seed=5))


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path / "home"))
    return tmp_path


def _spec(name: str, penalty: float, after: float, pp: int = 1) -> ClusterSpec:
    save_hardware(dataclasses.replace(BASE, name=name, idle_wake=penalty,
                                      idle_wake_after=after))
    return dataclasses.replace(SPEC, hardware=name, pp=pp)


def test_a_profile_without_a_wake_simulates_exactly_as_the_base_profile():
    plain = simulate(SPEC, WORKLOAD)
    zero = simulate(_spec("zero-wake", 0.0, 0.5), WORKLOAD)
    assert [r.token_times for r in zero.records] == [r.token_times for r in plain.records]


@settings(max_examples=30, deadline=None)
@given(first=st.floats(0.0, 3.0), gap=st.floats(0.0, 3.0),
       penalty=st.floats(1e-3, 0.05), after=st.floats(0.01, 2.0))
def test_a_step_pays_the_wake_only_after_the_instance_sat_idle_long_enough(
        first: float, gap: float, penalty: float, after: float):
    """Two requests: the first at `first` (the instance idle since 0), the second `gap`
    after the first one finished where nothing wakes; each TTFT moves by the penalty
    exactly where its step started after `after` seconds idle or more, else not."""
    base_spec, woke_spec = SPEC, _spec("wake", penalty, after)
    alone = [RequestSpec(first, 64, 8)]
    finish = simulate(base_spec, alone).records[0].token_times[-1]
    pair = [RequestSpec(first, 64, 8), RequestSpec(finish + gap, 96, 4)]
    base, woke = simulate(base_spec, pair).records, simulate(woke_spec, pair).records
    first_wake = penalty if first >= after and first > 0 else 0.0
    idle = gap - first_wake  # the second request's idle gap where the first paid its wake
    assume(abs(first - after) > 1e-9 and abs(idle - after) > 1e-9)
    assert woke[0].token_times[0] == pytest.approx(base[0].token_times[0] + first_wake)
    if idle > 0:  # the second came to an idle instance (else it joined the first's steps)
        assert woke[0].token_times == pytest.approx(
            [t + first_wake for t in base[0].token_times])
        second_wake = penalty if idle >= after else 0.0
        assert woke[1].token_times == pytest.approx(
            [t + second_wake for t in base[1].token_times])


def test_steps_that_follow_others_pay_nothing_so_tpot_stays():
    """A busy run: only the steps after the idle gaps pay, and decode steps never do."""
    base = simulate(SPEC, WORKLOAD)
    woke = simulate(_spec("busy-wake", 0.030, 0.0), WORKLOAD)
    num_woken = sum(1 for b, w in zip(base.records, woke.records, strict=True)
                    if w.token_times[0] > b.token_times[0] + 1e-9)
    assert 0 < num_woken < len(WORKLOAD)
    for b, w in zip(base.records, woke.records, strict=True):
        gaps_b = [y - x for x, y in zip(b.token_times, b.token_times[1:], strict=False)]
        gaps_w = [y - x for x, y in zip(w.token_times, w.token_times[1:], strict=False)]
        assert max((g_w - g_b for g_b, g_w in zip(gaps_b, gaps_w, strict=True)),
                   default=0.0) <= 0.030 + 1e-9


def test_a_pipeline_instance_pays_the_wake_when_no_batch_is_in_any_stage():
    lone = [RequestSpec(1.0, 64, 4)]
    spec = dataclasses.replace(SPEC, pp=2)
    base = simulate(spec, lone).records[0]
    woke = simulate(_spec("pp-wake", 0.020, 0.5, pp=2), lone).records[0]
    assert woke.token_times == pytest.approx([t + 0.020 for t in base.token_times])


def test_old_profiles_load_without_a_wake_and_bad_values_are_refused():
    data = BASE.to_dict()
    del data["idle_wake"], data["idle_wake_after"]
    loaded = HardwareSpec.from_dict({**data, "name": "old"})
    assert (loaded.idle_wake, loaded.idle_wake_after) == (0.0, 0.0)
    with pytest.raises(ValueError, match="idle_wake must be a finite non-negative"):
        dataclasses.replace(BASE, idle_wake=-0.01)
