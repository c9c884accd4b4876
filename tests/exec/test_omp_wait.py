"""andante's OpenMP wait policy is set before torch loads libgomp, never over a user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from andante.exec.cpu_share import read_cpu_times
from andante.exec.omp_wait import CHOICE_ENV, WAIT_POLICY, choose_wait_policy, others_share_now

REPO = Path(__file__).resolve().parents[2]


def test_a_user_setting_is_kept() -> None:
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "5")):
        env = {name: value}
        assert "environment's" in choose_wait_policy(env)
        assert env == {name: value}


def test_keep_leaves_openmp_s_defaults() -> None:
    env = {CHOICE_ENV: "keep"}
    choose_wait_policy(env)
    assert env == {CHOICE_ENV: "keep"}


def test_the_rule_is_set_only_before_torch_is_imported() -> None:
    code = ("import os, sys; from andante.exec.omp_wait import choose_wait_policy; "
            "env = {}; choose_wait_policy(env); print(env.get('OMP_WAIT_POLICY')); "
            "import torch; env = {}; print(choose_wait_policy(env)); print(env)")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", CHOICE_ENV)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120,
                         env={**clean, "PYTHONPATH": str(REPO)}).stdout.splitlines()
    assert out[0] == WAIT_POLICY
    assert "torch was imported first" in out[1] and out[2] == "{}"


def test_auto_spins_only_when_the_machine_looked_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as before torch is imported
    idle, busy = {CHOICE_ENV: "auto"}, {CHOICE_ENV: "auto"}
    assert "spinning" in choose_wait_policy(idle, look=lambda: 0.02)
    assert idle == {CHOICE_ENV: "auto"}  # libgomp's default: spin, then sleep
    assert "0.55" in choose_wait_policy(busy, look=lambda: 0.55)
    assert busy["OMP_WAIT_POLICY"] == WAIT_POLICY
    unknown = {CHOICE_ENV: "auto"}
    assert "not measurable" in choose_wait_policy(unknown, look=lambda: None)
    assert unknown["OMP_WAIT_POLICY"] == WAIT_POLICY
    mine = {CHOICE_ENV: "auto", "GOMP_SPINCOUNT": "7"}  # a user's own setting wins
    assert "environment's" in choose_wait_policy(mine, look=lambda: 0.0)
    assert mine == {CHOICE_ENV: "auto", "GOMP_SPINCOUNT": "7"}


def test_the_look_reads_the_allowed_cpus_of_proc_stat() -> None:
    """A neighbour busy on one of our two cores of a four-core host: 0.5, not 0.25."""
    texts = iter(["cpu  0 0 0 400 0 0 0 0\ncpu0 0 0 0 100 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0\n"
                  "cpu2 0 0 0 100 0 0 0 0\ncpu3 0 0 0 100 0 0 0 0\n",
                  "cpu  100 0 0 700 0 0 0 0\ncpu0 0 0 0 200 0 0 0 0\ncpu1 100 0 0 100 0 0 0 0\n"
                  "cpu2 0 0 0 200 0 0 0 0\ncpu3 0 0 0 200 0 0 0 0\n"])
    share = others_share_now(0.0, lambda: read_cpu_times(lambda: next(texts),
                                                         lambda: frozenset({0, 1})))
    assert share == pytest.approx(0.5, abs=0.01)
