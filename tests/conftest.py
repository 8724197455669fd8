"""Shared fixtures. Area-specific builders live in their own modules (tests/trace_fixtures.py ...)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from data_paths import SAMPLES

# The read guard (tests/read_guard.py): a test that opens a file outside the repository fails.
from read_guard import (  # noqa: F401 - pytest hooks, registered by being named here
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_sessionfinish,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "analyzer" / "examples"


@pytest.fixture
def samples_dir() -> Path:
    """The real sample files, copied into tests/data/samples/ (provenance: SOURCES.md there)."""
    return SAMPLES


@pytest.fixture
def seed_csv() -> Path:
    """The worked example's request-timeline.csv (TTFT 190 ms, E2E 3,915 ms, 150 tokens)."""
    return EXAMPLES / "request-timeline.csv"


@pytest.fixture
def alt_csv() -> Path:
    """The worked example's hands-on exercise timeline (TTFT 420 ms, 255 gaps of 18 ms)."""
    return EXAMPLES / "request-timeline-alt.csv"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


# Property tests run derandomized in the suite (the same examples on every run, so CI cannot
# flake); set TOKENTRACE_FUZZ_RANDOM=1 for fresh random examples (benchmarks/reliability.py
# --fuzz runs larger, random campaigns).
import os as _os

from hypothesis import settings as _settings

_settings.register_profile("tokentrace", derandomize=True, database=None, deadline=None, print_blob=True)
_settings.register_profile("tokentrace-random", deadline=None, print_blob=True)
_settings.load_profile("tokentrace-random" if _os.environ.get("TOKENTRACE_FUZZ_RANDOM") else "tokentrace")
