"""Where the tests' data files live: tests/data/ in this repository, nowhere else.

Every file a test reads is copied here with its provenance (tests/data/SOURCES.md), so a fresh
clone with nothing beside it runs every test. conftest's ``samples_dir`` fixture returns
``SAMPLES``; modules that need a path at collection time (parametrize lists) import these
names. conftest's read guard fails any test that opens a file outside the repository.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
SAMPLES = DATA / "samples"  # real files real systems wrote (tests/data/samples/SOURCES.md)
REAL = SAMPLES / "real"  # captures of real tools (vLLM, SGLang, AIPerf, openai-v2)
CAPTURES = DATA / "real"  # the project's own captures (AIPerf and OpenLLMetry against tokentrace)
