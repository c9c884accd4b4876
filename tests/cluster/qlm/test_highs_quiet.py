"""HiGHS's banner never reaches stdout (CLI JSON output stays clean)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from andante.cluster.qlm import highs_solver
highs_solver.quiet_first_highs()
import highspy
highspy.Highs()
print("only this")
"""


def test_highs_banner_is_kept_off_stdout() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True)
    assert out.stdout == "only this\n"
