"""The documentation: README.md stays short, every link in it and in docs/ resolves, every command exists.

Commands are read from the fenced bash / sh / console blocks. `reproflow ...` lines go through the CLI's own
argument parser, `make ...` lines through `make -n` (a dry run: it prints the commands, runs none), and
`sbatch ... sbatch/<name>.sbatch` lines must name a committed script. Other commands (apt-get, git, srun,
enroot, ...) are counted, not run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT, reproflow

from reproflow.app.cli import build_parser

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_LIMIT = 12 * 1024

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"<[^<>\n]+>")
SEPARATORS = {"&&", "||", ";", "|"}


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def split_page(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[tuple[int, str]]]]]:
    """The page's prose lines and its fenced blocks (first line number, language, lines), each line numbered."""
    return split_page_text(path.read_text(encoding="utf-8"), page_id(path) if path.is_relative_to(ROOT) else path.name)


def split_page_text(text: str, name: str = "page") -> tuple[list[tuple[int, str]],
                                                             list[tuple[int, str, list[tuple[int, str]]]]]:
    """split_page of a page's text."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, list[tuple[int, str]]]] = []
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            blocks.append((number, match.group(2).lower(), []))
        elif fence is not None and line.strip().startswith(fence) and not line.strip("`~ "):
            fence = None
        elif fence is not None:
            blocks[-1][2].append((number, line))
        else:
            prose.append((number, line))
    assert fence is None, f"{name}: a fenced block is never closed"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a markdown page, with GitHub's -1, -2 ... suffixes for repeated headings."""
    seen: Counter[str] = Counter()
    found = set()
    for _, line in split_page(path)[0]:
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return frozenset(found)


def paragraphs(path: Path) -> list[tuple[int, str]]:
    """The prose of a page as paragraphs (lines joined, so a link may wrap), each with its first line number."""
    found: list[tuple[int, str]] = []
    previous = -1
    for number, line in split_page(path)[0]:
        if not line.strip():
            previous = -1
            continue
        if previous == number - 1 and found:
            found[-1] = (found[-1][0], f"{found[-1][1]} {line.strip()}")
        else:
            found.append((number, line.strip()))
        previous = number
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """Every link and image target in the prose of a page (inline code left out)."""
    found = []
    for number, text in paragraphs(path):
        for match in LINK.finditer(INLINE_CODE.sub("", text)):
            found.append((number, match.group(1)))
    return found


def link_problem(page: Path, target: str) -> str | None:
    """Why a link target does not resolve, or None."""
    file_part, _, anchor = target.partition("#")
    if file_part:
        resolved = (page.parent / file_part).resolve()
        if not resolved.is_relative_to(ROOT):
            return f"{target} points outside the repository"
        if not resolved.exists():
            return f"{target}: no such file ({resolved.relative_to(ROOT).as_posix()})"
    else:
        resolved = page
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: {page_id(resolved)} has no heading with the anchor #{anchor}"
    return None


# Placeholders of the docs' command lines and the real values they are checked with.
SUITES = sorted(p.stem for p in (ROOT / "workflows").glob("*.toml"))
SUBSTITUTES = {
    "<suite>": "param-demo" if "param-demo" in SUITES else SUITES[0],
    "<folder>": "reference",
    "<id>": "1234",
    "<job>": "1234",
    "<search>": "1234",
}


def command_lines(path: Path) -> list[tuple[int, str]]:
    """Command lines of the page's shell blocks: `$ ` prompts stripped, continuation lines joined."""
    found = []
    for _, lang, lines in split_page(path)[1]:
        if lang not in SHELL_BLOCKS:
            continue
        pending: tuple[int, str] | None = None
        for number, raw in lines:
            line = raw.strip()
            if pending is None:
                if lang == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                elif line.startswith("$ "):
                    line = line[2:]
                if not line or line.startswith("#"):
                    continue
                pending = (number, "")
            text = pending[1] + line
            if text.endswith("\\"):
                pending = (pending[0], text[:-1] + " ")
                continue
            found.append((pending[0], text))
            pending = None
        if pending is not None:
            found.append(pending)
    return found


def substitute(line: str) -> str:
    """Known placeholders become real values; others become one word each (spaces to '_')."""
    for placeholder, value in SUBSTITUTES.items():
        line = line.replace(placeholder, value)
    return PLACEHOLDER.sub(lambda m: m.group(0).replace(" ", "_"), line)


def commands(line: str) -> list[list[str]]:
    """The simple commands of a line (split at &&, ||, ; and |), leading VAR=value words and `...` dropped."""
    words = shlex.split(substitute(line), comments=True)
    result: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            result.append([])
        elif word != "...":
            result[-1].append(word)
    for command in result:
        while command and ASSIGNMENT.match(command[0]):
            command.pop(0)
    return [command for command in result if command]


@cache
def committed_scripts() -> frozenset[str] | None:
    """The sbatch scripts git tracks, or None outside a git checkout (then existing files count)."""
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "sbatch"], capture_output=True, text=True)
    return frozenset(done.stdout.split()) if done.returncode == 0 else None


@cache
def make_target_problem(target: str) -> str | None:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"`make -n {target}` failed ({done.returncode}): {done.stderr.strip()}"
    return None


def reproflow_problem(args: list[str]) -> str | None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {exc.code}"
    return None


def check_command(command: list[str]) -> tuple[str, str, str | None]:
    """(kind, outcome, problem): outcome is 'checked', 'skipped: <why>' or 'not run'."""
    word = command[0]
    if word == "reproflow" or word.endswith("/reproflow"):
        return "reproflow", "checked", reproflow_problem(command[1:])
    if word == "make":
        targets = [w for w in command[1:] if not w.startswith("-") and "=" not in w]
        if any(PLACEHOLDER.search(t) for t in targets):
            return "make", "skipped: a placeholder target", None
        problems = [p for p in map(make_target_problem, targets or ["help"]) if p]
        return "make", "checked", "; ".join(problems) or None
    if word == "sbatch":
        scripts = [w for w in command[1:] if w.endswith(".sbatch")]
        if not scripts:
            return "sbatch", "skipped: no script named", None
        if PLACEHOLDER.search(scripts[-1]):
            return "sbatch", "skipped: a placeholder script", None
        script = (ROOT / scripts[-1]).resolve()
        tracked = committed_scripts()
        name = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else scripts[-1]
        if script.parent != ROOT / "sbatch" or not script.is_file() or (tracked is not None and name not in tracked):
            return "sbatch", "checked", f"{scripts[-1]} is not a committed script under sbatch/"
        return "sbatch", "checked", None
    if word == "bash" and len(command) > 1 and command[1].endswith(".sh"):
        if PLACEHOLDER.search(command[1]):
            return "bash", "skipped: a placeholder script", None
        exists = (ROOT / command[1]).is_file()
        return "bash", "checked", None if exists else f"{command[1]}: no such script"
    return Path(word).name, "not run", None


def test_readme_is_short():
    size = README.stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; at most {README_LIMIT}: move detail into docs/"


PAGE_LIMIT = 20 * 1024
PARAGRAPH_WORDS = 150
ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def prose_paragraphs(path: Path) -> list[tuple[int, str]]:
    """The page's prose paragraphs (first line number, text): lines between blank lines, headings, tables
    and fences, each list item one of its own."""
    found: list[tuple[int, list[str]]] = []
    inside, last = False, -1
    for number, line in split_page(path)[0]:
        text = line.strip()
        if not text or text.startswith(("#", "|")):
            inside = False
        else:
            if not inside or number != last + 1 or ITEM.match(line):
                found.append((number, []))
            found[-1][1].append(text)
            inside = True
        last = number
    return [(number, " ".join(lines)) for number, lines in found if lines]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_pages_are_short_and_their_paragraphs_too(page):
    size = page.stat().st_size
    assert page == README or size <= PAGE_LIMIT, (
        f"{page_id(page)} is {size} bytes; at most {PAGE_LIMIT}: split it by what it is about")
    long = [f"{page_id(page)}:{number}: {len(text.split())} words" for number, text in prose_paragraphs(page)
            if len(text.split()) > PARAGRAPH_WORDS]
    assert not long, f"paragraphs over {PARAGRAPH_WORDS} words (split them): " + "; ".join(long)


def test_a_paragraph_is_what_a_reader_sees_as_one(tmp_path):
    """The paragraph rule's own reading: a list item, a heading, a table or a fence ends a paragraph."""
    sample = tmp_path / "paragraphs.md"
    sample.write_text("# T\n\none two\nthree\n\n- four\n  five\n- six\n\n```\nseven\n```\neight\n| a |\n")
    assert prose_paragraphs(sample) == [(3, "one two three"), (6, "- four five"), (8, "- six"), (13, "eight")]


def test_docs_index_lists_every_page():
    listed = {target.partition("#")[0] for _, target in links(DOCS / "index.md")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and p.name not in listed]
    assert not missing, f"docs/index.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_resolve(page, capsys):
    problems, relative, external = [], 0, 0
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            external += 1
            continue
        relative += 1
        problem = link_problem(page, target)
        if problem:
            problems.append(f"{page_id(page)}:{number}: {problem}")
    with capsys.disabled():
        print(f"\n{page_id(page)}: {relative} relative links checked, {external} external not fetched")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_exist(page, capsys):
    problems: list[str] = []
    tally: Counter[tuple[str, str]] = Counter()
    for number, line in command_lines(page):
        try:
            parsed = commands(line)
        except ValueError as exc:
            problems.append(f"{page_id(page)}:{number}: cannot split `{line}`: {exc}")
            continue
        for command in parsed:
            kind, outcome, problem = check_command(command)
            tally[kind, outcome] += 1
            if problem:
                problems.append(f"{page_id(page)}:{number}: `{line.strip()}`: {problem}")
    summary = ", ".join(f"{kind} {outcome} {count}" for (kind, outcome), count in sorted(tally.items()))
    with capsys.disabled():
        print(f"\n{page_id(page)}: {sum(tally.values())} commands: {summary or 'none'}")
    assert not problems, "\n".join(problems)


def test_the_claims_page_is_what_the_code_declares() -> None:
    """docs/claims.md (make claims-doc) holds the table `reproflow claims` prints from every family's
    claims.py: a claim changed in code and not in the page fails here."""
    declared = reproflow("claims")
    assert declared.returncode == 0, declared.stderr
    page = (ROOT / "docs" / "claims.md").read_text()
    assert declared.stdout.strip() in page, "docs/claims.md is stale: run make claims-doc"


def test_every_commands_help_prints_as_written() -> None:
    """argparse formats help strings with %, never descriptions: a doubled %% in a description prints
    as two."""
    parser = build_parser()
    actions = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    subparsers = [p for a in actions for p in a.choices.values()]
    assert subparsers
    for sub in [parser, *subparsers]:
        assert "%%" not in (sub.description or ""), sub.prog
        text = sub.format_help()
        assert "%%" not in text, sub.prog


def _docs_tool():
    """tools/docs.py, the generator `make docs` runs, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_tool", ROOT / "tools" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_generated_blocks_are_what_the_recorded_runs_give(page):
    tool = _docs_tool()
    text = page.read_text()
    assert tool.generate(text, tool.recorded()) == text, f"{page_id(page)}: a generated block differs: run make docs"


def test_a_hand_edit_of_a_generated_figure_fails():
    """A digit changed inside a generated block is what `make docs --check` (and the test above) refuses."""
    tool = _docs_tool()
    text = README.read_text()
    block = tool.BLOCK.search(text)
    assert block is not None, "README.md has no generated block"
    digit = re.search(r"\d", block.group(3))
    assert digit is not None, block.group(3)
    at = block.start(3) + digit.start()
    edited = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]
    assert tool.generate(edited, tool.recorded()) == text != edited


def test_recorded_runs_are_summaries_of_make_demo_runs():
    import json

    import jsonschema

    from reproflow.reporting.summary import SCHEMA

    tool = _docs_tool()
    runs = tool.recorded()
    assert runs, "docs/recorded/ holds no run"
    schema = json.loads(SCHEMA.read_text())
    for run in runs:
        jsonschema.validate(run["summary"], schema, cls=jsonschema.Draft202012Validator)
        text = json.dumps(run["summary"])
        assert not re.search(r'"/[^"]*"', text), "a recorded run keeps no path of its machine (tools/docs.py record)"



def test_a_partial_reproduction_is_not_a_make_demo():
    """`reproduce --only TARGET` records a run too (the Aceso search step); the tables of `make demo`'s
    verdicts and duration read only reproductions of every default target."""
    tool = _docs_tool()
    demo = {"summary": {"run": {"command": ["reproflow", "reproduce", "--executor", "local"], "executor": "local",
                                "git_commit": "a" * 40}}}
    only = {"summary": {"run": {"command": ["reproflow", "reproduce", "--executor", "local", "--only", "aceso-large"],
                                "executor": "local", "git_commit": "b" * 40}}}
    assert tool.last_commit_runs([demo, only]) == [demo]


def test_a_bench_table_says_when_the_configs_differ(tmp_path, monkeypatch):
    """The budget table states what the digests show: the same config on every core count, or not."""
    tool = _docs_tool()
    monkeypatch.setattr(tool, "BENCH", tmp_path)
    head = ("cores,budget,stages,iteration_ms,megatron_ms,depths,configs_sha256,explored,wall_s,"
            "git_commit,device_name,host_cpus,timestamp\n")
    row = "{},20000 explored cases per depth,12,84160.0,119070.0,13,{},239810,150.0,{},a CPU,2,2026-12-07T00:00:00\n"
    for digests, said in ((("ab", "ab"), "byte for byte the same"), (("ab", "cd"), "not the same")):
        (tmp_path / "aceso_budget.csv").write_text(head + "".join(
            row.format(cores, digest, "c" * 40) for cores, digest in zip((2, 1), digests, strict=True)))
        text = tool.aceso_budget([])
        assert f"is {said} on 2 core(s) and on 1 core(s)" in text and "commit ccccccc on a CPU, 2 cores" in text

# A run quoted by hand: named by its commit ("three runs of 1a2b3c4", "a run of commit 1a2b3c4").
TYPED = re.compile(r"\bruns?\s+of\s+(?:commit\s+)?[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_run_is_quoted_outside_a_generated_block(page):
    """Figures from runs come from the recorded runs (make docs): a page's prose that names a run by its
    commit outside a generated block fails. (It catches runs named so, not every figure typed by hand.)"""
    tool = _docs_tool()
    outside = tool.outside_blocks(page.read_text())
    prose = "\n".join(line for _, line in split_page_text(outside)[0])
    found = [m.group(0) for m in TYPED.finditer(prose)]
    assert not found, f"{page_id(page)} quotes runs by hand: {found}; record the run and generate the figure"


def test_a_run_is_recorded_as_its_manifest_last_says(tmp_path, monkeypatch):
    """The summary `reproduce` writes precedes its run's end; `record` takes the run's state and end from
    the manifest, and keeps no path of the machine."""
    import json

    tool = _docs_tool()
    results, reports = tmp_path / "results", tmp_path / "reports"
    (results / "runs").mkdir(parents=True)
    reports.mkdir()
    run = {"run_id": "20261207-000000-abcdef", "command": ["reproflow", "reproduce", "--results", str(results)],
           "git_commit": "a" * 40, "start": "2026-12-07T00:00:00+00:00", "end": "", "state": "running",
           "image": str(tmp_path / "reproflow-cpu.sqsh")}
    (reports / "summary.json").write_text(json.dumps({"results": str(results), "run": run, "left_out": [],
                                                      "machines": [{"image": run["image"]}]}))
    ended = run | {"end": "2026-12-07T00:25:00+00:00", "state": "completed"}
    (results / "runs" / "20261207-000000-abcdef.json").write_text(json.dumps(ended))
    monkeypatch.setattr(tool, "RECORDED", tmp_path / "recorded")
    kept = json.loads(tool.record(reports, "a note").read_text())
    assert kept["summary"]["run"]["end"] == ended["end"] and kept["summary"]["run"]["state"] == "completed"
    assert kept["note"] == "a note" and str(tmp_path) not in json.dumps(kept)
    # a results folder copied elsewhere (a clean room's): its manifest is read where it is now
    moved = results.rename(tmp_path / "copied")
    (moved / "runs" / "20261207-000000-abcdef.json").write_text(json.dumps(ended | {"state": "failed"}))
    assert json.loads(tool.record(reports, "", moved).read_text())["summary"]["run"]["state"] == "failed"


@pytest.mark.distributed
def test_the_readmes_first_five_minutes_run_as_written(tmp_path: Path) -> None:
    """The README's first commands after the environment, as written, in an empty folder: two comms runs,
    a report and a compare that ends with each metric's verdict."""
    block = re.search(r"The first five minutes.*?```bash\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "README.md lost its first five minutes"
    commands = [shlex.split(line.split("#")[0]) for line in block[1].splitlines() if line.startswith("reproflow ")]
    assert [c[1] for c in commands] == ["run", "report", "run", "compare"], commands
    for argv in commands:
        proc = reproflow(*argv[1:], cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "second against first: " in proc.stdout and "metrics matched" in proc.stdout
    assert (tmp_path / "first-report" / "report.html").is_file() and (tmp_path / "compare" / "compare.md").is_file()
