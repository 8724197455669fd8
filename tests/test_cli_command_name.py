"""The command tokentrace prints in its hints runs as printed: bare
``tokentrace`` only when that name on PATH is this installation's script."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from analyzer.cli._command_name import tokentrace_command

SCRIPT = Path(sys.executable).with_name("tokentrace")


def test_bare_name_when_the_environment_is_on_path(monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert tokentrace_command() == "tokentrace"


def test_the_scripts_path_when_it_is_not_and_it_runs_as_printed(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"/usr/bin{os.pathsep}/bin")  # as after the README's commands
    monkeypatch.chdir(Path(sys.prefix).parent)  # the folder holding .venv (the checkout)
    printed = tokentrace_command()
    assert printed == str(SCRIPT.relative_to(Path.cwd())) == f"{Path(sys.prefix).name}/bin/tokentrace"
    done = subprocess.run(shlex.split(printed) + ["requests", "--help"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "Usage: tokentrace requests" in done.stdout, done.stderr
    monkeypatch.chdir(tmp_path)  # elsewhere: the absolute path
    assert tokentrace_command() == shlex.quote(str(SCRIPT))


def test_another_tokentrace_on_path_is_not_taken_for_this_one(monkeypatch, tmp_path: Path) -> None:
    other = tmp_path / "bin" / "tokentrace"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{SCRIPT.parent}")
    monkeypatch.chdir(tmp_path)
    assert tokentrace_command() == shlex.quote(str(SCRIPT))
