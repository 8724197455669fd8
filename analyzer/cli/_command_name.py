"""How a user runs tokentrace from where they are: the name to print in hints.

``tokentrace`` only when that name on ``$PATH`` is this installation's console script (the
virtual environment is on PATH); otherwise the script's own path, relative to the working
directory when it lies below it (``.venv/bin/tokentrace`` after the README's commands), so a
printed command runs as printed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["tokentrace_command"]


def tokentrace_command() -> str:
    """The command that runs this installation's ``tokentrace`` from the working directory,
    shell-quoted."""
    script: Path | None = Path(sys.executable).with_name("tokentrace")  # the environment's console script
    if script is not None and not script.is_file():
        argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
        script = argv0 if argv0 is not None and argv0.name == "tokentrace" and argv0.is_file() else None
    if script is None:  # not installed as a console script: nothing better to name
        return "tokentrace"
    found = shutil.which("tokentrace")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "tokentrace"
    absolute = Path(os.path.abspath(script))
    try:
        relative = absolute.relative_to(Path.cwd())
        return shlex.quote(str(relative) if len(relative.parts) > 1 else f"./{relative}")
    except ValueError:
        return shlex.quote(str(absolute))
