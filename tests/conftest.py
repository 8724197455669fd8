"""Shared fixtures. Area-specific builders live in their own modules (tests/trace_fixtures.py ...)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO.parent / "shared" / "samples"
EXAMPLES = REPO / "analyzer" / "examples"


@pytest.fixture
def samples_dir() -> Path:
    """The real sample files in ../shared/samples (read where they are)."""
    if not SAMPLES.is_dir():
        pytest.fail(f"shared samples not found at {SAMPLES}: CI lays shared/ beside the checkout")
    return SAMPLES


@pytest.fixture
def seed_csv() -> Path:
    """The seed's request-timeline.csv (TTFT 190 ms, E2E 3,915 ms, 150 tokens)."""
    return EXAMPLES / "request-timeline.csv"


@pytest.fixture
def alt_csv() -> Path:
    """The seed's hands-on exercise timeline (TTFT 420 ms, 255 gaps of 18 ms)."""
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
