"""scripts/setup installs once for both scripts: switching between
./scripts/demo (extras all) and ./scripts/test (all,spark) does not reinstall each time.

The script runs for real in a copy of the checkout's setup files; only the venv's python is a
stand-in that records the pip installs it is asked for (a real install takes minutes and a
network)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> "$(dirname "$0")/../pip.log"; fi
exit 0
"""


def _setup(root: Path, extras: str) -> str:
    env = {**os.environ, "EXTRAS": extras}
    done = subprocess.run(["bash", "scripts/setup"], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_switching_between_demo_and_test_extras_installs_once(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup", tmp_path / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / ".venv" / "pip.log"

    def installs() -> list[str]:
        return [line for line in log.read_text().splitlines() if "-e" in line.split()] if log.exists() else []

    _setup(tmp_path, "all")  # ./scripts/demo
    assert installs()[-1].endswith('-e .[all]') and len(installs()) == 1
    _setup(tmp_path, "all,spark")  # ./scripts/test: the extra is added
    assert installs()[-1].endswith("-e .[all,spark]") and len(installs()) == 2
    for extras in ("all", "all,spark", "spark,all", "all"):  # every later switch: nothing installed
        said = _setup(tmp_path, extras)
        assert "already installed" in said and "extras 'all,spark' cover" in said, said
    assert len(installs()) == 2
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text() + "\n# changed\n")
    _setup(tmp_path, "all")  # a changed pyproject reinstalls, keeping the extras already there
    assert installs()[-1].endswith("-e .[all,spark]") and len(installs()) == 3


def test_ci_runs_the_readme_test_command_and_nothing_else() -> None:
    """.ci/run only calls ./scripts/test, and the Chromium install lives in scripts/test: the
    README's test command runs what CI runs (the report's browser test included)."""
    commands = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', 'exec ./scripts/test "$@"']
    test_script = (REPO / "scripts" / "test").read_text()
    assert "apt-get install -y -q chromium" in test_script
    readme = (REPO / "README.md").read_text()
    assert readme.split("```bash\n", 1)[1].split("```", 1)[0].count("\n") == 2  # exactly two commands
    assert "./scripts/test" in readme.split("```bash\n", 1)[1].split("```", 1)[0]
