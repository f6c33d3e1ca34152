"""The report page: one self-contained HTML file (figures inlined) and its markdown twin.

Built from what `reproflow report` wrote: per family its claims, tables (CSV, with the title and note
of the markdown twin) and figures (PNG); then the hardware each suite ran on and the provenance of
every job. The HTML needs nothing beside it; the markdown links the PNGs next to it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pandas as pd

from reproflow.reporting.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    METHOD,
    NOT_APPLICABLE,
    NOT_COMPARED,
    NOT_MEASURED,
    Claim,
    counts,
)
from reproflow.store.files import atomic_write, read_json_object

# Tables longer than this are folded (<details>) in the HTML page and cut in the markdown twin.
FOLD_ROWS = 24
PACKAGES = ("reproflow", "torch", "numpy", "pandas", "matplotlib", "submitit", "mpi4py", "deepspeed", "megatron-core")
CSS = """
body{font-family:system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px}
th{background:#f2f2f2}figure{margin:1em 0}img{max-width:100%;border:1px solid #ddd}
.holds{background:#dff3df}.fails{background:#fbe0e0}.unsure{background:#fff4cc}.missing{background:#eee}
nav a{margin-right:1em}.scroll{overflow-x:auto;max-width:100%}.note{font-size:12px;color:#555}
section{border-top:2px solid #444;margin-top:2em}
"""
STATUS_CLASS = {HOLDS: "holds", FAILS: "fails", INCONCLUSIVE: "unsure", NOT_MEASURED: "missing",
                NOT_COMPARED: "missing", NOT_APPLICABLE: "missing"}


@dataclass
class Section:
    """One family's part of the page."""

    family: str
    summary: str
    files: list[Path] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)


def _anchor(name: str) -> str:
    return "family-" + re.sub(r"[^A-Za-z0-9-]+", "-", name)


def _table_parts(path: Path) -> tuple[str, pd.DataFrame, str]:
    """(title, data, note) of a written table: the title and note from its markdown twin when there is one."""
    data = pd.read_csv(path)
    twin = path.with_suffix(".md")
    if not twin.is_file():
        return path.stem.replace("_", " "), data, ""
    lines = twin.read_text().splitlines()
    title = lines[0].removeprefix("# ") if lines else path.stem
    last_row = max((i for i, line in enumerate(lines) if line.startswith("|")), default=0)
    return title, data, "\n".join(lines[last_row + 1:]).strip()


def _claims_frame(claims: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([c.record() for c in claims])


def _html_claims(claims: list[Claim]) -> str:
    """The claims as a table, the columns of Claim.record, each row coloured by its status."""
    if not claims:
        return "<p>No claims.</p>"
    records = [c.record() for c in claims]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in records[0])

    def cell(key: str, v: object) -> str:
        text = html.escape(f"{v:.4g}" if isinstance(v, float) else str(v or ""))
        return "<br>".join(case_lines(text)) if key in ("where", "cases") else text

    rows = [f'<tr class="{STATUS_CLASS[str(r["status"])]}">'
            + "".join(f"<td>{cell(k, v)}</td>" for k, v in r.items()) + "</tr>" for r in records]
    return f"<div class=scroll><table><tr>{head}</tr>{''.join(rows)}</table></div>"


def case_lines(text: str) -> list[str]:
    """A claim's `where` split into its cases, one a line: at every ', ' or '; ' outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if depth == 0 and ch in ",;" and text[i + 1:i + 2] == " ":
            parts.append(text[start:i + 1])
            start = i + 2
    return [*parts, text[start:]]


def html_table(data: pd.DataFrame) -> str:
    """A frame as an HTML table, folded (<details>) past FOLD_ROWS rows; cells as to_markdown writes them
    (pandas' to_html took most of a comparison's time on a two-thousand-row table)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in data.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in data.itertuples(index=False, name=None))
    text = f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    if len(data) <= FOLD_ROWS:
        return text
    return f"<details><summary>{len(data)} rows</summary>{text}</details>"


def html_files(files: list[Path]) -> str:
    """Written tables (CSV, with their markdown twins' title and note) and figures (PNG, inlined) as HTML."""
    parts = []
    for path in files:
        if path.suffix == ".csv":
            title, data, note = _table_parts(path)
            parts.append(f"<h3>{html.escape(title)}</h3><p class=note>{html.escape(path.name)}</p>"
                         + html_table(data) + (f"<p class=note>{html.escape(note)}</p>" if note else ""))
        elif path.suffix == ".png":
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{html.escape(path.name)}</figcaption></figure>")
    return "\n".join(parts)


def _cell(v: object, floatfmt: str = ".4g") -> str:
    """A table cell's text: floats to `floatfmt`, missing values empty."""
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return format(v, floatfmt)
    return str(v)


def to_markdown(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured markdown table (no extra dependency)."""
    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    # A bar inside a cell would end it.
    body = ["| " + " | ".join(_cell(v, floatfmt).replace("|", "\\|") for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def _md_table(data: pd.DataFrame) -> str:
    if len(data) <= FOLD_ROWS:
        return to_markdown(data)
    return to_markdown(data.head(FOLD_ROWS)) + f"\n({len(data) - FOLD_ROWS} more rows in the CSV)\n"


def _md_files(files: list[Path], out_dir: Path) -> str:
    parts = []
    for path in files:
        link = path.relative_to(out_dir).as_posix()
        if path.suffix == ".csv":
            title, data, note = _table_parts(path)
            parts.append(f"### {title}\n\n[{path.name}]({link})\n\n{_md_table(data)}" + (f"\n{note}\n" if note else ""))
        elif path.suffix == ".png":
            parts.append(f"![{path.stem}]({link})\n")
    return "\n".join(parts)


def hardware_table(results: Path) -> pd.DataFrame:
    """One row per (suite, host) from the environment records the jobs wrote (`<results>/<suite>/env/`)."""
    rows = []
    for path in sorted(results.glob("*/env/*.json")):
        record = read_json_object(path)
        if record is None:
            continue
        hw = record.get("hardware") if isinstance(record.get("hardware"), dict) else {}
        gpus = hw.get("gpus") if isinstance(hw.get("gpus"), list) else []
        rows.append({"suite": path.parent.parent.name, "host": str(record.get("host", "")),
                     "cpu": str(hw.get("cpu_model", "")), "cpus": hw.get("cpus"), "memory_gib": hw.get("memory_gib"),
                     "gpus": ", ".join(map(str, gpus)) or "none", "os": str(hw.get("os", "")),
                     "python": str(hw.get("python", ""))})
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).drop_duplicates(["suite", "host", "cpu", "gpus"]).reset_index(drop=True)


def versions() -> pd.DataFrame:
    """Versions of the packages behind this report (those installed)."""
    found = []
    for name in PACKAGES:
        try:
            found.append({"package": name, "version": metadata.version(name)})
        except metadata.PackageNotFoundError:
            continue
    return pd.DataFrame(found)


def write_page(out_dir: Path, sections: list[Section], hardware: pd.DataFrame, jobs: pd.DataFrame,
               left_out: list[Path], lead: Sequence[Path] = ()) -> list[Path]:
    """`report.html` (self-contained) and `report.md` in `out_dir`, the `lead` figures (the claims as a
    picture) above the claims' table; returns both paths."""
    claims = [c for s in sections for c in s.claims]
    tally = counts(claims)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commits = ", ".join(sorted({str(c) for c in jobs.get("git_commit", pd.Series(dtype=str)).dropna()})) or "unknown"
    machines = sorted({f"{r.cpu}, {r.cpus} cores, {r.memory_gib} GiB, GPUs: {r.gpus}" for r in hardware.itertuples()})
    summary = (f"{len(claims)} claims: {tally[HOLDS]} hold, {tally[FAILS]} do not hold, {tally[INCONCLUSIVE]} "
               f"inconclusive, {tally[NOT_MEASURED]} not measured, {tally[NOT_COMPARED]} not compared, "
               f"{tally[NOT_APPLICABLE]} {NOT_APPLICABLE} "
               f"(low / high: {METHOD}). "
               f"Measured on {'; '.join(machines) or 'unrecorded hardware'}. Built {stamp} from "
               f"commit(s) {commits}.")
    extra = [("hardware", "Hardware", hardware), ("provenance", "Jobs (provenance)", jobs),
             ("versions", "Package versions of this report", versions())]
    nav = " ".join(f'<a href="#{_anchor(s.family)}">{html.escape(s.family)}</a>' for s in sections)
    nav += ' <a href="#claims">claims</a>' + "".join(f' <a href="#{a}">{a}</a>' for a, _, _ in extra)
    body = [f"<h1>reproflow report</h1><p>{html.escape(summary)}</p><nav>{nav}</nav>",
            f'<section id="claims"><h2>Claims</h2>{html_files(list(lead))}{_html_claims(claims)}</section>']
    md = [f"# reproflow report\n\n{summary}\n", "## Claims\n", _md_files(list(lead), out_dir),
          _md_table(_claims_frame(claims))]
    for s in sections:
        body.append(f'<section id="{_anchor(s.family)}"><h2>{html.escape(s.family)}</h2><p>{html.escape(s.summary)}'
                    f"</p>{_html_claims(s.claims) if s.claims else ''}{html_files(s.files)}"
                    + ("" if s.files else "<p>No results of this family.</p>") + "</section>")
        md.append(f"## {s.family}\n\n{s.summary}\n\n{_md_files(s.files, out_dir) or 'No results of this family.'}\n")
    for anchor, title, frame in extra:
        body.append(f'<section id="{anchor}"><h2>{title}</h2>{html_table(frame) if len(frame) else "<p>none</p>"}'
                    "</section>")
        md.append(f"## {title}\n\n{_md_table(frame) if len(frame) else 'none'}\n")
    if left_out:
        body.append("<section><h2>Left out</h2>" + html_files(left_out) + "</section>")
        md.append("## Left out\n\n" + _md_files(left_out, out_dir))
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>reproflow report</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
    paths = [out_dir / "report.html", out_dir / "report.md"]
    atomic_write(paths[0], page)
    atomic_write(paths[1], "\n".join(md))
    return paths
