"""andante's OpenMP wait policy is set before torch loads libgomp, never over a user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from andante.exec.omp_wait import CHOICE_ENV, WAIT_POLICY, choose_wait_policy

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
