"""`<reports>/summary.json`: a report as data a program reads, versioned, its shape in summary.schema.json.

It holds the run (the newest run manifest under the results folder), the machines the rows were
measured on, the steps of the `reproduce` that wrote it (none when `report` ran alone), every claim
with its design, cases, intervals and verdict, and the limits and published figures used. A change of
its shape is a new SUMMARY_VERSION and a new schema.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

import reproflow
from reproflow.reporting.claims import Claim, counts
from reproflow.store.files import atomic_write, json_object, read_regular
from reproflow.store.runs import RUNS

SUMMARY_VERSION = 1
SCHEMA = Path(__file__).with_name("summary.schema.json")
# What says which machine measured a row: the jobs' columns, counted by distinct value sets.
MACHINE = ("device_name", "host_cpus", "network", "backend", "device", "torch_version", "nccl_version", "image",
           "image_sha256", "container_runtime")
# The run manifest's fields a reader compares runs by.
RUN = ("run_id", "command", "git_commit", "start", "end", "state", "executor", "cluster", "nodes", "host",
       "cpu_model", "gpus", "image", "image_sha256")


def _number(value: object) -> float | None:
    """A float for JSON: None for a missing or non-finite one."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _interval(interval: tuple[float, float] | None) -> list[float | None] | None:
    return None if interval is None else [_number(interval[0]), _number(interval[1])]


def _claim(claim: Claim) -> dict[str, Any]:
    """One claim: its declaration, verdict, deciding figures and every case."""
    more = claim.record()["samples to decide"]
    return {"family": claim.family, "claim": claim.statement, "status": claim.status, "ratio": claim.ratio,
            "paper": claim.paper, "threshold": claim.threshold, "at_least": _number(claim.at_least),
            "at_most": _number(claim.at_most), "design": claim.spec.design.value,
            "selection": claim.spec.selection.value, "error_control": claim.error_control,
            "level": claim.level, "measured": _number(claim.measured), "interval": _interval(claim.interval),
            "samples_to_decide": more or None, "not_applicable": claim.not_applicable or None,
            "detail": claim.detail or None, "make_target": claim.target or None,
            "cases": [{"label": c.label, "status": c.status, "ratio": _number(c.ratio),
                       "interval": _interval(c.interval), "corrected": _interval(c.corrected),
                       "note": c.note or None} for c in claim.cases]}


def newest_run(results: Path) -> dict[str, Any] | None:
    """The newest run manifest under `results` (by its start), with the fields in RUN; None without one."""
    found = []
    for path in sorted((results / RUNS).glob("*.json")):
        try:
            record = json_object(read_regular(path))
        except OSError:
            continue
        if record and isinstance(record.get("start"), str) and isinstance(record.get("run_id"), str):
            found.append(record)
    if not found:
        return None
    newest = max(found, key=lambda r: (r["start"], r["run_id"]))
    return {key: newest.get(key) for key in RUN}


def _machines(provenance: pd.DataFrame) -> list[dict[str, Any]]:
    """Each distinct machine the jobs ran on (the MACHINE columns they record) and how many jobs."""
    columns = [c for c in MACHINE if c in provenance.columns]
    if not columns:
        return []
    recorded = provenance[columns].astype(object).where(provenance[columns].notna(), "").astype(str)
    grouped = recorded.value_counts().reset_index(name="jobs")  # "" where a job recorded no value
    return [{**{c: str(row[c]) for c in columns}, "jobs": int(row["jobs"])} for _, row in grouped.iterrows()]


def summary(results: Path, claims: Sequence[Claim], provenance: pd.DataFrame, *,
            steps: Sequence[Mapping[str, Any]] = (), limits: str = "", references: Sequence[str] = (),
            left_out: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The summary of a report built from `results` (see the module)."""
    return {"summary_version": SUMMARY_VERSION, "reproflow_version": reproflow.__version__,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": str(results.resolve()),
            "run": newest_run(results), "machines": _machines(provenance), "steps": [dict(s) for s in steps],
            "claims": [_claim(c) for c in claims], "counts": counts(claims), "limits": limits,
            "references": list(references), "left_out": [dict(x) for x in left_out]}


def write_summary(out_dir: Path, record: Mapping[str, Any]) -> Path:
    """Write `record` as `<out_dir>/summary.json` (no NaN or infinity: JSON has none)."""
    path = out_dir / "summary.json"
    atomic_write(path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    return path
