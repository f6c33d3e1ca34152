"""Analysis helpers: load every result CSV, pick the newest measurement, write tables and figures.

The papers' tables and figures are built by each family's `report` module (`build(frame, out_dir) ->
list[Path]`, given that family's rows), its claims by its `claims` module (`claims(frame, reports)`),
both found by name, as the family registry finds the families.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pandas as pd

from reproflow.reporting import catalog
from reproflow.reporting.claims import Claim, ClaimSpec, level_for, read_looks
from reproflow.reporting.compare import NOT_MEASURED, against_published
from reproflow.reporting.figures import forest_plot
from reproflow.reporting.intervals import LEVEL, at_level
from reproflow.reporting.limits import LIMITS, Published, limits
from reproflow.reporting.page import Section, hardware_table, to_markdown, write_page
from reproflow.reporting.summary import summary, write_summary
from reproflow.spec.errors import ReproflowError, printable
from reproflow.spec.family import AGGREGATE, PACKAGE, families
from reproflow.spec.params import canonical
from reproflow.store.files import file_stem, read_regular
from reproflow.store.results import (
    GATE_FAIL,
    PROVENANCE_COLUMNS,
    RESERVED,
    point_rows,
    quarantine,
    result_files,
)


@dataclass
class Loaded:
    """What a results folder holds: the rows to aggregate, and what was kept out of them and why."""

    frame: pd.DataFrame
    # Points measured by jobs whose health gate failed: one row per point, with the gate's detail.
    gate_failed: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Torn files moved to <results>/quarantine: (where it is now, why).
    quarantined: list[tuple[Path, str]] = field(default_factory=list)


def read_results(results: Path) -> Loaded:
    """Every whole result file under `results`: torn ones are quarantined, points whose job failed its
    health gate are set aside; a file of an unknown schema version is an error."""
    frames, quarantined = [], []
    for path in result_files(results):
        try:  # bytes: a file that is not UTF-8 is quarantined below, with the reason
            data = read_regular(path)
        except OSError:  # gone, or no longer a regular file, since it was listed
            continue
        if not data.startswith(b"schema_version,"):
            raise ReproflowError(f"{path} is not a reproflow result file (no schema_version column). Keep other "
                                 f"CSVs (profiles, logs, tables) out of the results folder {results}.")
        problem = point_rows(data)[1]
        if problem.startswith("result schema"):
            raise ReproflowError(f"{path} has {problem}. Re-run its suite with --force or use a matching reproflow.")
        if problem:
            moved = quarantine(results, path, problem)
            print(f"reproflow: {path} is not a whole result file ({problem}); moved to {moved}, not aggregated. "
                  "Run its suite again to measure the point.", file=sys.stderr)
            quarantined.append((moved, problem))
            continue
        frames.append(pd.read_csv(io.BytesIO(data), dtype={"rank": str, "job_id": str}))
    if not frames:
        return Loaded(pd.DataFrame(), quarantined=quarantined)
    frame = with_defaults(pd.concat(frames, ignore_index=True))
    if "health_gate" not in frame.columns:
        return Loaded(frame, quarantined=quarantined)
    bad = frame["health_gate"] == GATE_FAIL
    gate_failed = frame.loc[bad, ["suite", "experiment", "point", "job_id", "nodelist", "health_detail"]]
    gate_failed = gate_failed.drop_duplicates(["suite", "experiment", "point", "job_id"])
    if len(gate_failed):
        print(f"reproflow: {len(gate_failed)} point(s) left out: their job failed its health gate "
              f"(jobs {', '.join(sorted(set(gate_failed['job_id'])))})", file=sys.stderr)
    return Loaded(frame[~bad].reset_index(drop=True), gate_failed.reset_index(drop=True), quarantined)


def load_results(results: Path) -> pd.DataFrame:
    """The rows to aggregate under `results` (see read_results)."""
    return read_results(results).frame


def with_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows written before a family declared a parameter get that parameter's default, so old and
    new results group together (e.g. `implementation` = reproflow)."""
    known = families()
    for name in frame["family"].unique():
        if name not in known:
            continue
        mine = frame["family"] == name
        for param in known[name].params:
            if param.name not in frame.columns:
                frame[param.name] = pd.Series(pd.NA, index=frame.index, dtype=object)
            missing = mine & frame[param.name].isna()
            if missing.any():
                frame[param.name] = frame[param.name].astype(object)
                frame.loc[missing, param.name] = canonical(param.coerce(param.default))
    return frame


def newest(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of the newest run of every point, so stale reruns do not mix into one figure."""
    keys = ["suite", "experiment", "point", "world_size", "backend", "device"]
    last = frame.groupby(keys, dropna=False)["timestamp"].transform("max")
    return frame[frame["timestamp"] == last]


def aggregates(frame: pd.DataFrame) -> pd.DataFrame:
    """Only the rows aggregated across ranks."""
    return frame[frame["rank"].astype(str) == AGGREGATE]


def wide(frame: pd.DataFrame, index: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per `index` combination, one column per metric (median over repeats)."""
    sub = frame[frame["metric"].isin(metrics)]
    table = sub.pivot_table(index=list(index), columns="metric", values="value", aggfunc="median")
    return table.reindex(columns=[m for m in metrics if m in table.columns]).reset_index()


def over_baseline(table: pd.DataFrame, keys: Sequence[str], baseline: pd.Series, column: str) -> pd.Series:
    """`column` of every row divided by the `baseline` row's with the same `keys` (NaN where none):
    speed-ups and ratios against a reference configuration."""
    base = table.loc[baseline, [*keys, column]].rename(columns={column: "_baseline"})
    matched = table[list(keys)].merge(base, on=list(keys), how="left")
    return pd.Series(table[column].to_numpy() / matched["_baseline"].to_numpy(), index=table.index)


def integral(frame: pd.DataFrame) -> pd.DataFrame:
    """Float columns holding only whole numbers (sizes, shapes after a concat with gaps) as integers."""
    out = frame.copy()
    for col in out.columns:
        values = out[col]
        if pd.api.types.is_float_dtype(values) and values.notna().any():
            present = values.dropna()
            if (present == present.round()).all() and present.abs().max() < 2**53:
                out[col] = values.astype("Int64")
    return out


def write_table(frame: pd.DataFrame, out_dir: Path, name: str, title: str, note: str = "") -> list[Path]:
    """`<name>.csv` and `<name>.md` (title line, table, and an optional note) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = integral(frame)
    csv_path, md_path = out_dir / f"{file_stem(name)}.csv", out_dir / f"{file_stem(name)}.md"
    frame.to_csv(csv_path, index=False)
    md_path.write_text(f"# {title}\n\n" + to_markdown(frame) + (f"\n{note}\n" if note else ""))
    return [csv_path, md_path]


def against_limits(frame: pd.DataFrame) -> pd.DataFrame:
    """Each rate the reference table bounds (limits.toml's [[use]]), where the rows name hardware it knows:
    the best median over the repeats per family, metric, device and setting, the limit, and the fraction."""
    table = limits()
    bounded = {(u.family, u.metric) for u in table.uses}
    rows = aggregates(newest(frame))
    rows = rows[[(f, m) in bounded for f, m in zip(rows["family"], rows["metric"], strict=True)]]
    out = []
    keys = ["family", "metric", "device_name", "nodelist", "world_size"]
    for (family, metric, device, nodes, ranks), group in rows.groupby(keys):
        settings = [c for c in group.columns if c not in RESERVED and group[c].notna().any()]
        medians = group.groupby(settings, dropna=False)["value"].median() if settings else group["value"]
        for setting, value in medians.items():
            params = dict(zip(settings, setting if isinstance(setting, tuple) else (setting,), strict=True))
            found = table.limit(family, metric, {k: str(v) for k, v in params.items()}, str(device),
                                len(str(nodes).split(",")), int(ranks))
            if found:
                out.append({"family": family, "metric": metric, "device_name": device, "nodes": nodes, "ranks": ranks,
                            "dtype": params.get("dtype", ""), "median": value, "limit": found[0],
                            "limit_is": found[1], "setting": setting, "fraction": value / found[0]})
    if not out:
        return pd.DataFrame()
    best = pd.DataFrame(out).rename(columns={"nodes": "nodelist", "ranks": "world_size"}).sort_values(
        "fraction", ascending=False)
    return best.drop_duplicates([*keys, "limit_is"]).drop(columns="setting")


def against_reference(published: Published, results: Path, out_dir: Path) -> tuple[Section, list[Path]]:
    """The page's section setting the newest rows under `results` against a published figure of the
    reference table, and its table `reference_<name>.csv` / `.md`."""
    table = catalog.using_index(lambda index: against_published(published, index, results))
    counts = table["verdict"].value_counts()
    judged = ", ".join(f"{n} {verdict}" for verdict, n in counts.items() if verdict != NOT_MEASURED)
    here = table[table["verdict"] != NOT_MEASURED]
    summary = (f"{published.family} {published.metric} against {published.name}, measured on {published.hardware} "
               f"({published.source}). {here[['match', 'metric']].drop_duplicates().shape[0]} of "
               f"{len(published.values)} published value(s) measured here"
               + (f", by {here['measured_at'].nunique()} point(s) on {', '.join(sorted(set(here['measured_on'])))}: "
                  f"{judged}." if judged else "."))
    files = write_table(table.dropna(axis=1, how="all"), out_dir, f"reference_{published.name}",
                        f"Against {published.name}",
                        f"Ratio = measured / published, with its {LEVEL:.0%} interval from the repeats here (the "
                        "published figure is one value); speed: the ratio oriented so that above 1 is better; "
                        "of_limit_b: the measured median as a fraction of its hardware's limit, where the rows name "
                        "a GPU the table knows.")
    return Section(f"against {published.name}", summary, [files[0]]), files


def compare_implementations(table: pd.DataFrame, keys: list[str], value: str, out_dir: Path, name: str,
                            title: str, note: str) -> tuple[pd.DataFrame, list[Path]]:
    """`value` per implementation side by side, reproflow's ratio to each other one, and the median
    ratio per group of `keys[:-1]`; writes `<name>.*` and `<name>_summary.*`."""
    wide_values = table.pivot_table(index=keys, columns="implementation", values=value).reset_index()
    wide_values.columns.name = None
    others = [c for c in wide_values.columns if c not in keys and c != "reproflow"]
    ratios = [f"reproflow/{other}" for other in others]
    for other, ratio in zip(others, ratios, strict=True):
        wide_values[ratio] = wide_values["reproflow"] / wide_values[other]
    written = write_table(wide_values, out_dir, name, title, note)
    summary = wide_values.groupby(keys[:-1])[ratios].median().reset_index()
    written += write_table(summary, out_dir, f"{name}_summary", f"Median of reproflow's {value} ratio", note)
    return wide_values, written


def setting_label(row: pd.Series) -> str:
    """Legend text for one measured setting: ranks, backend, device."""
    return f"{int(row['world_size'])} ranks, {row['backend']}/{row['device']}"


def family_part(family: str, part: str) -> ModuleType | None:
    """The family's module `part` (report: its tables and figures; claims: its claims), found by name as
    the registry finds families, or None when the family has none."""
    name = f"{PACKAGE}.{family}.{part}"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def declared_claims() -> list[ClaimSpec]:
    """Every family's claims, as declared (its claims module's CLAIMS)."""
    return [spec for name in families() for spec in getattr(family_part(name, "claims"), "CLAIMS", ())]


def check_claims(results: Path, out_dir: Path) -> tuple[list[Claim], list[Path]]:
    """Every family's claims checked again on the rows under `results` (and the tables an earlier report
    wrote under `out_dir`), without rebuilding tables, figures or the page; claims.csv and .md rewritten."""
    frame = read_results(results).frame
    if frame.empty:
        raise ReproflowError(f"no results under {results}: nothing to check the claims on.")
    looks = read_looks(results)
    claims = [c for name in families()
              for c in _contained(name, results, partial(_claims, family_part(name, "claims"),
                                                         _family_rows(frame, name), out_dir, looks.get(name, 1)), [])]
    return claims, _write_claims(claims, out_dir)


T = TypeVar("T")


def _contained(family: str, results: Path, make: Callable[[], T], instead: T) -> T:
    """A family's tables or claims from its rows, or `instead` with one line saying why: rows a whole file
    held but its family cannot read (a metric renamed, a parameter it never wrote) leave the family's
    section out, not the report."""
    try:
        return make()
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        print(f"reproflow: {family}: its rows under {results} do not make its tables and claims "
              f"({type(exc).__name__}: {printable(str(exc))[:200]}); left out of the report. Check those rows, or "
              "measure its points again.", file=sys.stderr)
        return instead


def _family_rows(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """The family's rows, without the columns only other families fill."""
    return frame[frame["family"] == name].dropna(axis=1, how="all")


def _claims(module: ModuleType | None, rows: pd.DataFrame, out_dir: Path, looks: int) -> list[Claim]:
    """The family's claims, each interval at the level of one of the `looks` its claims may get."""
    if module is None or not hasattr(module, "claims"):
        return []
    level = level_for(looks)
    with at_level(level):  # judge() takes the level the block sets
        return list(module.claims(rows, out_dir))


def _write_claims(claims: Sequence[Claim], out_dir: Path) -> list[Path]:
    return write_table(pd.DataFrame([c.record() for c in claims]), out_dir, "claims",
                       "The papers' claims, checked on these results")


def build_reports(results: Path, out_dir: Path, only: Sequence[str] = (),
                  references: Sequence[Published] = (), steps: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Tables and figures for every family that has results (or only the families in `only`), then,
    for all families, the claims checked, the report page (report.html, report.md), with a section
    against each published figure of `references`, and summary.json (with the `steps` of the
    `reproduce` that built it; summary.json alone where those steps measured no point); returns the
    files written."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    unknown = sorted(set(only) - set(families()))
    if unknown:
        raise ReproflowError(f"--family {', '.join(unknown)}: no such family. Known: {', '.join(sorted(families()))}.")
    loaded = read_results(results)
    looks = read_looks(results)
    frame = loaded.frame
    written: list[Path] = []
    if len(loaded.gate_failed) or loaded.quarantined:
        kept_out = pd.concat([loaded.gate_failed.assign(reason="health gate failed"),
                              pd.DataFrame({"file": [str(p) for p, _ in loaded.quarantined],
                                            "reason": [why for _, why in loaded.quarantined]})], ignore_index=True)
        written += write_table(kept_out, out_dir, "left_out", "Points left out of every table and figure")
    left_out = [p for p in written if p.suffix == ".csv"]
    if frame.empty and steps and not written:
        # A reproduction whose steps write only their own tables (Aceso's search step on the artifact's
        # database): no rows to report, but the run and its steps are still summarised.
        out_dir.mkdir(parents=True, exist_ok=True)
        return [write_summary(out_dir, summary(results, [], pd.DataFrame(), steps=steps, limits=str(LIMITS)))]
    if frame.empty:
        left = f" ({len(kept_out)} point(s) left out: {out_dir / 'left_out.md'})" if written else ""
        raise ReproflowError(f"no results to aggregate under {results}{left}. Run a suite first, e.g. "
                             "`reproflow run param-demo`.")
    sections = []
    for name, fam in families().items():
        if only and name not in only:
            continue
        rows = _family_rows(frame, name)
        module = family_part(name, "report")
        files: list[Path] = []
        if len(rows) and module is None:
            table = wide(aggregates(newest(rows)), ["suite", "experiment", "point"], sorted(rows["metric"].unique()))
            files = write_table(table, out_dir, f"{name}_summary", f"{name}: all metrics")
        elif len(rows):
            files = _contained(name, results, partial(module.build, rows, out_dir), [])
        # What a family's own tools wrote into <out>/<family>/ (Aceso's result scripts) belongs to it too,
        # but for the tables its report folds into one of its own (FOLDED: their name prefixes).
        folded = tuple(getattr(module, "FOLDED", ()))
        files += sorted(p for p in (out_dir / name).glob("*")
                        if p.suffix == ".png" or (p.suffix == ".csv" and not p.name.startswith(folded)))
        claims = _contained(name, results, partial(_claims, family_part(name, "claims"), rows, out_dir,
                                                   looks.get(name, 1)), [])
        written += files
        sections.append(Section(name, fam.summary, [p for p in files if p.suffix in (".csv", ".png")], claims))
    for published in references:
        section, files = against_reference(published, results, out_dir)
        sections.append(section)
        written += files
    if only:
        return written
    bounded = against_limits(frame)
    if len(bounded):
        files = write_table(bounded, out_dir, "limits", "Rates against the hardware's limits",
                            f"The best setting of each rate, as a fraction of its limit ({LIMITS}).")
        written += files
        sections.append(Section("hardware limits", f"Each bounded rate's best median against the limit of the "
                                f"hardware that measured it ({LIMITS}: dense peak per dtype, memory bandwidth, "
                                "NVLink).", [files[0]]))
    provenance = frame[[c for c in PROVENANCE_COLUMNS if c in frame.columns]].drop_duplicates("job_id")
    provenance = provenance.drop(columns=["timestamp"])
    written += write_table(provenance, out_dir, "jobs", "Jobs behind these results")
    claims = [c for s in sections for c in s.claims]
    written += _write_claims(claims, out_dir)
    forest = forest_plot(claims, out_dir)
    written += forest
    written += write_page(out_dir, sections, hardware_table(results), provenance, left_out,
                          [p for p in forest if p.suffix == ".png"])
    kept = [{"file": str(p), "reason": why} for p, why in loaded.quarantined] + [
        {"point": f"{r.suite}/{r.experiment}/{r.point}", "job_id": str(r.job_id), "reason": "health gate failed"}
        for r in loaded.gate_failed.itertuples()]
    written.append(write_summary(out_dir, summary(results, claims, provenance, steps=steps, limits=str(LIMITS),
                                                  references=[p.name for p in references], left_out=kept)))
    return written
