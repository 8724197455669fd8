"""The top-level ``tokentrace --help`` names every verb that is installed, and only those;
docs/cli.md has a section for each."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from analyzer.cli import cli


def test_group_help_lists_every_verb() -> None:
    text = CliRunner().invoke(cli, ["--help"]).output
    listed = set()
    for line in text.split("Options:")[0].splitlines():
        match = re.match(r"\s*(Instrument|Load|Query|Schema|Check|Report):\s+(.*)", line)
        if match:
            listed |= set(re.findall(r"[a-z]+", match.group(2).split("(")[0]))
    assert set(cli.commands) <= listed, f"verbs missing from the group help: {sorted(set(cli.commands) - listed)}"
    assert listed <= set(cli.commands), f"group help lists verbs that do not exist: {sorted(listed - set(cli.commands))}"


def test_cli_doc_has_a_section_per_verb() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    documented = set(re.findall(r"^## tokentrace (\S+)", doc, flags=re.M))
    assert documented == set(cli.commands)


def test_every_help_fits_80_columns() -> None:
    """What people read fits a terminal: `tokentrace VERB --help` at 80 columns, examples
    included (click keeps `\\b` example lines as written, so they are wrapped in the source)."""
    runner = CliRunner()
    too_wide = []
    for name in ["", *sorted(cli.commands)]:
        result = runner.invoke(cli, [*([name] if name else []), "--help"], terminal_width=80)
        assert result.exit_code == 0, name
        too_wide += [f"{name or 'tokentrace'}: {len(line)}: {line}" for line in result.output.splitlines()
                     if len(line) > 80]
    assert not too_wide, "\n".join(too_wide)


def test_db_format_and_engine_are_declared_once() -> None:
    """--db and --format (analyzer/cli/_options.py) and --engine (source_options) have one
    declaration each that every verb shares; collect's --format (jsonl|parquet, the output
    file's) and serve's --engine (continuous|sequential) are other options that share only
    the name."""
    root = Path(__file__).resolve().parents[1] / "analyzer" / "cli"
    found = {flag: sorted(p.name for p in root.glob("*.py") if f'"{flag}"' in p.read_text())
             for flag in ("--db", "--format", "--engine")}
    assert found == {"--db": ["_options.py"], "--format": ["_options.py", "collect.py"],
                     "--engine": ["_query_verb.py", "serve.py"]}, found


def test_verb_discovery_lists_only_verbs() -> None:
    """Every module analyzer/cli lists as a verb registers a command of its own name, and
    every command comes from such a module: helpers are ``_``-prefixed, so discovery (and
    ``tokentrace VERB``'s import) never imports a module that is not a verb."""
    import importlib

    from analyzer.cli import verb_modules

    for name in verb_modules():
        module = importlib.import_module(f"analyzer.cli.{name}")
        assert cli.commands[name].callback.__module__ == module.__name__, name
    assert sorted(cli.commands) == verb_modules()
