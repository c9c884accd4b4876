"""`andante experiment`: its parser reads no experiment, and the command finds the
checkout's `experiments/` package without changing `sys.path`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_building_the_parser_reads_no_experiment(tmp_path: Path) -> None:
    done = _run("""
        import sys
        before = list(sys.path)
        from andante.cli.main import build_parser
        build_parser()
        assert sys.path == before, sys.path
        assert not [m for m in sys.modules if m.split(".")[0] == "experiments"]
    """, tmp_path, ROOT)
    assert done.returncode == 0, done.stderr


def test_the_checkout_experiments_are_found_from_elsewhere(tmp_path: Path) -> None:
    """andante imported through a link outside the checkout (so `experiments` is not on
    sys.path), run from another directory: the checkout's package answers."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "andante").symlink_to(ROOT / "andante")
    done = _run("""
        import sys
        before = list(sys.path)
        from andante.cli.main import main
        assert main(["experiment", "no-such-experiment"]) == 2
        assert sys.path == before, sys.path
        print(sys.modules["experiments"].__file__)
    """, tmp_path, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "unknown experiment 'no-such-experiment'" in done.stderr
    assert "'kunserve'" in done.stderr and "'qlm'" in done.stderr
    assert done.stdout.strip() == str(ROOT / "experiments" / "__init__.py")
