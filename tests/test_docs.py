"""The manual stays true where a machine can check it (README.md, docs/, benchmarks/RESULTS.md).

- The README is a front door: at most 150 lines, and what tokentrace is, who it is for and
  the two commands (the same test command .ci/run runs) on its first 24 lines at 80 columns;
  it links every page of docs/.
- Every command in a block marked runnable runs, with the exit status it says. A runnable
  block is a fenced code block whose line before it is ``<!-- runnable -->`` (invisible when
  rendered). Its lines run one by one with bash, in a scratch folder holding the output of
  ``tokentrace demo --tiny`` (``tokentrace-demo/``, copied to ``traces.duckdb``) and links to
  the repository's folders, with ``tokentrace`` on PATH; a line that ends in a comment saying
  ``exit N`` must exit N, every other line 0; ``export NAME=VALUE`` holds for the rest of the page.
- Every relative link leads to a file (and a heading, when it names one); every path under
  docs/, queries/, analyzer/, instrument/, tests/, benchmarks/, scripts/ or deploy/ named in
  a page exists (a glob must match something).
- Every ``tokentrace VERB`` in code names a verb, and every ``--flag`` after it is in
  ``tokentrace VERB --help``; a ``--flag`` named alone in the manual is some verb's (or one
  of the other programs' listed below).
- The manual (README and docs/, docs/design/ apart) names no issue number, no "seed" and no
  dated measurement or load average: those live in benchmarks/RESULTS.md and docs/design/.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
MANUAL = [README, *sorted((REPO / "docs").glob("*.md"))]  # what a user reads; docs/design/ apart
PAGES = [*MANUAL, *sorted((REPO / "docs" / "design").glob("*.md")), RESULTS]
PATH_ROOTS = ("docs", "queries", "analyzer", "instrument", "tests", "benchmarks", "scripts", "deploy")
RUNNABLE_MARK = "<!-- runnable -->"

# Flags the manual names that belong to other programs, not to a tokentrace verb (a line that
# runs benchmarks/ or scripts/ is not checked: those are the scripts' own options).
OTHER_PROGRAMS_FLAGS = {
    "--otlp-traces-endpoint", "--shutdown-timeout", "--speculative-config", "--dtype", "--enforce-eager",  # vllm
    "--no-deps",  # pip
    "--profile", "--rm", "--build",  # docker compose
    "--tokenizer",  # aiperf
    "--httpd",  # trace_processor_shell (Perfetto)
    "--version",  # tokentrace --version, the group's own option
}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def strip_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)


def code_blocks(text: str) -> list[tuple[str, bool, list[str]]]:
    """(info string, runnable, lines) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("```"):
            info, body, j = lines[i][3:].strip(), [], i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                body.append(lines[j])
                j += 1
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            blocks.append((info, before == RUNNABLE_MARK, body))
            i = j + 1
        else:
            i += 1
    return blocks


def commands(lines: list[str]) -> list[str]:
    """Shell lines with backslash continuations joined."""
    out, current = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            out.append(current.strip())
        current = ""
    return out


def inline_code(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", strip_code_blocks(text))


def code_texts(text: str) -> list[str]:
    """Every piece of code in a page: inline spans and the lines of fenced blocks."""
    out = inline_code(text)
    for _, _, lines in code_blocks(text):
        out += commands(lines)
    return out


@pytest.fixture(scope="module")
def help_flags() -> dict[str, set[str]]:
    runner = CliRunner()
    flags = {}
    for verb in cli.commands:
        result = runner.invoke(cli, [verb, "--help"], terminal_width=200)
        assert result.exit_code == 0, verb
        flags[verb] = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", result.output))
    return flags


# -- the README as a front door ---------------------------------------------------------------

def rendered_at_80(text: str) -> list[str]:
    """The README's lines as a terminal of 80 columns shows them: long lines wrap."""
    out = []
    for line in text.splitlines():
        out += textwrap.wrap(line, 80, drop_whitespace=False, replace_whitespace=False) or [""]
    return out


def test_readme_first_screen_says_what_who_and_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines (at most 150)"
    first = "\n".join(rendered_at_80(text)[:24])
    assert "OpenTelemetry" in first and "LLM inference" in first, "what tokentrace is"
    assert re.search(r"\bfor\b", first) and "Jaeger" in first and "SQL" in first and "latency report" in first, \
        "who it is for: tracing into Jaeger, querying dumps with SQL, auditing a latency report"
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[0] for line in block.splitlines()] == ["./scripts/demo", "./scripts/test"]
    assert block.strip() in first, "the two commands are on the first screen"
    ci = (REPO / ".ci" / "run").read_text()
    assert "exec ./scripts/test" in ci, "CI runs the README's test command"


def test_readme_lines_fit_80_columns() -> None:
    wide = [f"README.md:{n}: {len(line)} columns" for n, line in enumerate(README.read_text().splitlines(), 1)
            if len(line) > 80]
    assert not wide, "\n".join(wide)


#: the manual's size, in words outside fenced code blocks (what a reader reads as prose)
MANUAL_MAX_WORDS = 30_000


def test_the_manual_stays_under_its_word_budget() -> None:
    pages = sorted((REPO / "docs").glob("*.md"))  # docs/design/ apart
    words = {rel(p): len(strip_code_blocks(p.read_text()).split()) for p in pages}
    total = sum(words.values())
    biggest = ", ".join(f"{page} {n}" for page, n in sorted(words.items(), key=lambda kv: -kv[1])[:3])
    assert total <= MANUAL_MAX_WORDS, f"docs/ holds {total} words (at most {MANUAL_MAX_WORDS}); largest: {biggest}"
    print(f"docs/: {total} words outside code blocks")


def test_every_install_line_works_from_a_clone() -> None:
    """tokentrace is not on the package index: no page tells pip to fetch it from there; the
    one way into another environment (vLLM's) is said once, in docs/install.md, and linked."""
    from_index = re.compile(r"pip install\s+(?:-U\s+)?['\"]?tokentrace\b")
    found = [f"{rel(page)}: {code}" for page in MANUAL for code in code_texts(page.read_text())
             if from_index.search(code)]
    assert not found, "\n".join(found)
    install = (REPO / "docs" / "install.md").read_text()
    assert "## Installing into another environment" in install and "pip install PATH-TO-CLONE" in install
    vllm = (REPO / "docs" / "vllm.md").read_text()
    assert "install.md#installing-into-another-environment" in vllm and "pip install PATH-TO-CLONE" in vllm


def test_every_page_is_one_link_from_the_readme() -> None:
    """Every page of the manual is linked from the README, so each fact on it is two links away."""
    linked = {(REPO / t.partition("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", README.read_text())
              if not re.match(r"[a-z]+:", t)}
    missing = [rel(p) for p in MANUAL[1:] if p.resolve() not in linked]
    assert not missing, f"pages the README does not link: {missing}"


# -- runnable commands ------------------------------------------------------------------------

def runnable_lines() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for _, runnable, lines in code_blocks(page.read_text()):
            if runnable:
                out += [(rel(page), c) for c in commands(lines)]
    return out


def test_there_are_runnable_commands_in_the_readme_and_the_docs() -> None:
    pages = {page for page, _ in runnable_lines()}
    assert "README.md" in pages and any(p.startswith("docs/") for p in pages)


def expected_exit(command: str) -> int:
    match = re.search(r"\s#.*\bexits? (\d+)\b", command)
    return int(match.group(1)) if match else 0


def test_runnable_commands_run(tmp_path: Path) -> None:
    """Each marked command, in page order, on the tiny model's demo output (< 60 s on 2 cores)."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80"}
    env.pop("TOKENTRACE_DB", None)
    for name in (*PATH_ROOTS, ".venv"):
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    started = time.monotonic()
    demo = subprocess.run([str(bin_dir / "tokentrace"), "demo", "--tiny", "--quiet", "--requests", "4",
                           "--max-tokens", "16"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    shutil.copy(tmp_path / "tokentrace-demo" / "traces.duckdb", tmp_path / "traces.duckdb")
    failures, page_env, last_page = what_it_prints_differs(demo.stdout), env, None
    for page, command in runnable_lines():
        if page != last_page:  # an `export NAME=VALUE` line holds for the rest of its page
            page_env, last_page = dict(env), page
        exported = re.fullmatch(r"export ([A-Z_][A-Z0-9_]*)=(\S+)", command)
        if exported:
            page_env[exported.group(1)] = exported.group(2)
            continue
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=page_env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != expected_exit(command):
            failures.append(f"{page}: exit {result.returncode} (expected {expected_exit(command)}): {command}\n"
                            f"{(result.stderr or result.stdout)[-800:]}")
    elapsed = time.monotonic() - started
    assert not failures, "\n".join(failures)
    print(f"{len(runnable_lines())} runnable commands and the demo fixture in {elapsed:.1f} s")


def what_it_prints() -> list[str]:
    """The quoted texts of docs/install.md's "What it prints" (its numbered list), in page order."""
    section = (REPO / "docs" / "install.md").read_text().split("## What it prints", 1)[1]
    section = re.search(r"^1\. .*?(?=\n\n)", section, flags=re.S | re.M).group(0)
    return re.findall(r"`([^`\n]+)`", re.sub(r"\]\([^)]*\)", "]", section))


def what_it_prints_differs(stdout: str) -> list[str]:
    """docs/install.md's "What it prints" against what the demo printed: each quoted text is
    there, in the page's order; one failure line per text that is not."""
    failures, at = [], 0
    for text in what_it_prints():
        found = stdout.find(text, at)
        if found < 0:
            where = "out of order" if text in stdout else "not printed"
            failures.append(f"docs/install.md, What it prints: `{text}` {where} by tokentrace demo")
        else:
            at = found + len(text)
    return failures


def test_what_it_prints_is_checked_in_order() -> None:
    texts = what_it_prints()
    assert len(texts) >= 20 and "Per-request metrics" in texts and "Clock skew check" in texts
    printed = "\n".join(texts)
    assert what_it_prints_differs(printed) == []
    assert what_it_prints_differs("\n".join(reversed(texts)))  # the order counts
    assert what_it_prints_differs(printed.replace("request id", "request"))  # so does every text


# -- links and paths --------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} +(.+?)\s*$", strip_code_blocks(page.read_text()), flags=re.M)}


def test_relative_links_lead_somewhere() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", strip_code_blocks(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{rel(page)}: {target} (no such heading in {dest.name})")
    assert not broken, "\n".join(broken)


PATH_RE = re.compile(r"(?<![\w./~$-])((?:" + "|".join(PATH_ROOTS) + r")/[\w.*{},/-]*)")


def named_paths(text: str) -> list[str]:
    out = []
    for match in PATH_RE.finditer(text):
        path = match.group(1).rstrip(".,:;")
        if text[match.end(1):match.end(1) + 1] in ("<", "["):  # a pattern such as 2N_<engine>.sql
            continue
        out.append(path)
    return out


def expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for part in match.group(1).split(",")
            for p in expand_braces(path[:match.start()] + part + path[match.end():])]


def test_named_paths_exist() -> None:
    missing = []
    for page in PAGES:
        for path in named_paths(page.read_text()):
            for p in expand_braces(path):
                found = glob.glob(str(REPO / p)) if "*" in p else (REPO / p).exists()
                if not found:
                    missing.append(f"{rel(page)}: {p}")
    assert not missing, "\n".join(sorted(set(missing)))


# -- CLI verbs and flags ----------------------------------------------------------------------

VERB_RE = re.compile(r"(?:^|[\s/(`])tokentrace ([a-z]+)\b(.*)")


def verb_uses(text: str) -> list[tuple[str, list[str], str]]:
    """(verb, flags given to it, the code) for every ``tokentrace VERB`` in code."""
    out = []
    for code in code_texts(text):
        for piece in re.split(r"&&|\|\||;|\|", code):
            match = VERB_RE.search(piece)
            if match:
                args = match.group(2).split(" #", 1)[0]
                args = re.sub(r"'[^']*'|\"[^\"]*\"", "", args)  # SQL and other quoted text
                out.append((match.group(1), re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", args), code))
    return out


def test_verbs_and_their_flags_exist(help_flags: dict[str, set[str]]) -> None:
    wrong = []
    for page in PAGES:
        for verb, flags, code in verb_uses(page.read_text()):
            if verb not in help_flags:
                wrong.append(f"{rel(page)}: no verb {verb!r}: {code}")
                continue
            wrong += [f"{rel(page)}: tokentrace {verb} has no {f}: {code}" for f in flags if f not in help_flags[verb]]
    assert not wrong, "\n".join(wrong)


def test_every_flag_named_in_the_manual_exists(help_flags: dict[str, set[str]]) -> None:
    known = set().union(*help_flags.values()) | OTHER_PROGRAMS_FLAGS
    unknown = []
    for page in MANUAL:
        for code in code_texts(page.read_text()):
            if "benchmarks/" in code or "scripts/" in code:  # the scripts' own options
                continue
            code = re.sub(r"'[^']*'|\"[^\"]*\"", "", code)
            unknown += [f"{rel(page)}: {f} ({code})" for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", code)
                        if f not in known]
    assert not unknown, "\n".join(unknown)


# -- what the manual leaves to the results file and the design notes --------------------------

def test_the_manual_names_no_issue_seed_or_dated_measurement() -> None:
    found = []
    rules = {
        "an issue number": r"\bissues? #?\d+|(?<![\w&/])#\d+\b",
        "the seed": r"\b[Tt]he seed\b|\bseed's\b",
        "a dated measurement": r"\b20\d\d-\d\d-\d\d\b(?!T)",
        "a load average": r"\bload average",
        "a document outside the repository": r"shared/design",
    }
    for page in MANUAL:
        text = re.sub(r"\]\([^)]*\)", "]()", page.read_text())  # a link may name a dated results entry
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{rel(page)}:{number}: {what}: {line.strip()[:100]}"
                      for what, rule in rules.items() if re.search(rule, line)]
    assert not found, "\n".join(found)


def test_the_results_file_is_dated_newest_first() -> None:
    dates = re.findall(r"^## (20\d\d-\d\d-\d\d)", RESULTS.read_text(), flags=re.M)
    assert dates and dates == sorted(dates, reverse=True), dates
