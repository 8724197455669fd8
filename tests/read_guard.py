"""The read guard: a test that opens a file outside the repository fails.

A fresh clone with nothing beside it must run every test, so every file a test reads lives in
tests/data/ (provenance: tests/data/SOURCES.md). conftest loads this module as a pytest plugin.
It installs an audit hook (``sys.addaudithook``) that sees every ``open``, ``os.listdir`` and
``os.scandir`` of the test process and the arguments of every ``subprocess.Popen``, and records
each path that lies outside the allowed roots:

- the repository (its ``.venv`` included), the temporary directory, the Python installation
  and its site-packages (stdlib, installed packages and the model packages' weights), system
  directories (``/usr``, ``/lib``, ``/etc``, ``/proc``, ``/sys``, ``/dev``, ``/run``), the
  model caches (``$TOKENTRACE_CACHE_DIR`` or ``~/.cache/tokentrace``, ``$HF_HOME``) and the
  libraries' own caches and settings (``~/.cache``, ``~/.config``, font folders);
- never ``<repo>/../shared``, even when the repository itself sits in the temporary directory:
  that is where the sample files used to be read from.

A read recorded while a module is collected fails that module's collection; one recorded
during a test's setup, call or teardown fails the test at teardown, naming the paths. DuckDB
reads files in C++ where no audit hook sees them: tests/test_read_guard.py also scans the test
sources for paths that climb out of the repository.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = (str(REPO.parent / "shared"),)
_SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/run")


def _roots() -> tuple[str, ...]:
    """Directories a test may read from (absolute, resolved)."""
    home = Path.home()
    roots = [str(REPO), tempfile.gettempdir(), sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *sysconfig.get_paths().values(), *_SYSTEM,
             os.environ.get("TOKENTRACE_CACHE_DIR") or str(home / ".cache" / "tokentrace"),
             os.environ.get("HF_HOME") or str(home / ".cache" / "huggingface"),
             # libraries' own caches and settings (matplotlib's font list, fontconfig, pip)
             os.environ.get("XDG_CACHE_HOME") or str(home / ".cache"), os.environ.get("MPLCONFIGDIR", ""),
             str(home / ".config"), str(home / ".fonts"), str(home / ".local" / "share" / "fonts")]
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site module
        pass
    out = set()
    for r in roots:
        if r:
            out.add(os.path.abspath(r))
            out.add(os.path.realpath(r))
    return tuple(sorted(out))


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class ReadGuard:
    """Records the paths outside ``roots`` (or under ``forbidden``) that the process opens."""

    def __init__(self, roots: tuple[str, ...], forbidden: tuple[str, ...] = FORBIDDEN) -> None:
        self.roots = roots
        self.forbidden = tuple(os.path.abspath(f) for f in forbidden)
        self.outside: list[tuple[str, str]] = []  # (event, path)
        self.active = True

    def outside_path(self, path: str) -> bool:
        """Whether opening ``path`` (absolute or relative to the working directory) is a read
        outside the repository."""
        p = os.path.abspath(path)
        if _under(p, self.forbidden):
            return True
        if _under(p, self.roots):
            return False
        real = os.path.realpath(p)
        return _under(real, self.forbidden) or not _under(real, self.roots)

    def _check(self, event: str, path) -> None:
        if isinstance(path, int) or path is None:
            return
        try:
            text = os.fsdecode(path)
        except TypeError:
            return
        if text and self.outside_path(text):
            self.outside.append((event, text))

    def hook(self, event: str, args: tuple) -> None:
        """The audit hook: never raises (an exception here would fail the open itself)."""
        if not self.active or event not in ("open", "os.listdir", "os.scandir", "subprocess.Popen"):
            return
        try:
            self.active = False  # no recursion through the checks' own calls
            if event == "subprocess.Popen":
                _executable, argv, _cwd, _env = args
                for arg in [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or ()):
                    text = os.fsdecode(arg) if isinstance(arg, (str, bytes, os.PathLike)) else ""
                    for part in (text, text.partition("=")[2]):
                        if part.startswith(os.sep) and "\n" not in part and " " not in part:
                            self._check(event, part)
            else:
                self._check(event, args[0])
        except Exception:  # noqa: BLE001 - a guard must never break the code it watches
            pass
        finally:
            self.active = True

    def take(self) -> list[tuple[str, str]]:
        """The reads recorded since the last call, each once."""
        out, self.outside = list(dict.fromkeys(self.outside)), []
        return out


GUARD = ReadGuard(_roots())
_INSTALLED = False


def _message(reads: list[tuple[str, str]]) -> str:
    lines = [f"read outside the repository ({len(reads)} path(s)); copy the file into tests/data/ "
             "with its provenance in tests/data/SOURCES.md and read it through data_paths / samples_dir:"]
    lines += [f"  {event}: {path}" for event, path in reads[:20]]
    return "\n".join(lines)


def pytest_configure(config) -> None:
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(GUARD.hook)  # audit hooks cannot be removed: one per process
        _INSTALLED = True
    GUARD.take()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    GUARD.take()
    outcome = yield
    reads = GUARD.take()
    report = outcome.get_result()
    if reads and report is not None and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = _message(reads)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    GUARD.take()
    item.stash[_READS] = []
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    reads = item.stash.get(_READS, [])
    reads.extend(GUARD.take())
    if call.when == "teardown" and reads:
        report = outcome.get_result()
        if report.outcome != "failed":
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid}: {_message(reads)}"


_READS = pytest.StashKey[list]()


def pytest_sessionfinish(session, exitstatus) -> None:
    reads = GUARD.take()
    if reads:
        sys.stderr.write(_message(reads) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
