"""The top-level ``tokentrace --help`` names every verb that is installed."""

from __future__ import annotations

import re

from click.testing import CliRunner

from analyzer.cli import cli


def test_group_help_lists_every_verb() -> None:
    text = CliRunner().invoke(cli, ["--help"]).output
    listed = set()
    for line in text.split("Options:")[0].splitlines():
        match = re.match(r"\s*(Instrument|Load|Query|Check|Report):\s+(.*)", line)
        if match:
            listed |= set(re.findall(r"[a-z]+", match.group(2).split("(")[0]))
    assert set(cli.commands) <= listed, f"verbs missing from the group help: {sorted(set(cli.commands) - listed)}"
