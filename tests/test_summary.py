"""reports/summary.json: written by every report, valid against its committed schema, and read by the
script docs/results.md shows."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import ONE_COLLECTIVE, ROOT, reproflow

from reproflow.reporting.summary import SCHEMA, SUMMARY_VERSION

# The schema of each summary version, by its SHA-256: a schema changed without a new version fails here.
SCHEMAS = {1: "63799b46e568650799bd694821e260bfddea402f6aa38eacc44cf07fb3b7a718"}


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of a small comms suite and its report."""
    where = tmp_path_factory.mktemp("summary")
    (where / "comms.toml").write_text(ONE_COLLECTIVE % 5)
    for argv in (["run", str(where / "comms.toml"), "--results", str(where / "results")],
                 ["report", "--results", str(where / "results"), "--out", str(where / "reports")]):
        proc = reproflow(*argv)
        assert proc.returncode == 0, proc.stderr
    return where


def test_a_schema_changes_only_with_a_new_version() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["summary_version"] == {"const": SUMMARY_VERSION}
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMAS[SUMMARY_VERSION], (
        "summary.schema.json changed: bump SUMMARY_VERSION (reporting/summary.py) and record the new schema here")


def test_the_report_writes_a_summary_its_schema_accepts(reported: Path) -> None:
    summary = json.loads((reported / "reports" / "summary.json").read_text())
    jsonschema.validate(summary, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    claims = (reported / "reports" / "claims.csv").read_text().splitlines()
    assert len(summary["claims"]) == len(claims) - 1 > 0
    assert sum(summary["counts"].values()) == len(summary["claims"])
    assert summary["run"]["run_id"] and summary["run"]["state"] == "completed" and summary["steps"] == []
    assert [m["jobs"] for m in summary["machines"]] == [1] and summary["machines"][0]["backend"] == "gloo"
    page = (reported / "reports" / "report.md").read_text()  # the machine as its model and cores
    assert re.search(r"Measured on [^;]*?, \d+ cores, ", page), page[:600]
    assert not re.search(r"Measured on \d+ x ", page), page[:600]


def test_a_summary_with_a_field_the_schema_lacks_is_refused(reported: Path) -> None:
    """The schema is closed: a field the code adds without a new schema fails validation."""
    summary = json.loads((reported / "reports" / "summary.json").read_text())
    schema = json.loads(SCHEMA.read_text())
    for change in ({"extra": 1}, {"summary_version": 2}, {"claims": [{**summary["claims"][0], "status": "maybe"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**summary, **change}, schema, cls=jsonschema.Draft202012Validator)


def test_the_docs_script_prints_each_claims_verdict(reported: Path) -> None:
    page = (ROOT / "docs" / "results.md").read_text()
    script = re.search(r"## The run summary\n.*?```python\n(.*?)```", page, re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", script], cwd=reported, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((reported / "reports" / "summary.json").read_text())
    assert proc.stdout.splitlines() == [f"{c['status']:20} {c['family']:13} {c['claim']}" for c in summary["claims"]]


def test_a_reproduction_that_measured_no_point_is_summarised(tmp_path: Path) -> None:
    """`reproduce --only aceso-large` runs steps that write only their own tables: the report has no rows,
    yet the run and its steps are summarised (and the schema accepts it); `report` alone still refuses an
    empty results folder, naming it."""
    from reproflow.reporting.report import build_reports
    from reproflow.spec.errors import ReproflowError

    step = {"name": "aceso-large", "seconds": 700.0, "measured": 0, "skipped": 0, "failed": 0, "not_applicable": 0,
            "exit_code": 0, "job_ids": []}
    (tmp_path / "results").mkdir()
    written = build_reports(tmp_path / "results", tmp_path / "reports", steps=[step])
    assert [p.name for p in written] == ["summary.json"]
    record = json.loads(written[0].read_text())
    jsonschema.validate(record, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert record["steps"] == [step] and record["claims"] == []
    with pytest.raises(ReproflowError, match="no results to aggregate under"):
        build_reports(tmp_path / "results", tmp_path / "again")
