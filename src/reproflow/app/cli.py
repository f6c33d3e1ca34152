"""The `reproflow` command: list, run, render, submit, status, report, and the families' own commands.

User errors (bad suite, unknown name, missing tool) print one paragraph and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from reproflow import __version__, api
from reproflow.api import options
from reproflow.spec.errors import ParamError, ReproflowError, printable, shown, text_problem
from reproflow.spec.family import PACKAGE, families, family_names
from reproflow.spec.params import canonical, number, whole
from reproflow.spec.paths import project_root
from reproflow.spec.suite import Suite, load_suite, named_suite

EPILOG = """examples:
  reproflow list                         families, suites and their points
  reproflow run param-demo               run the demo suite here (4 gloo ranks + GEMM)
  reproflow run param-comms --procs-per-node 2 --dry-run
  reproflow run resharding -e n-to-m --explain    the plan of every resharding case
  reproflow resharding --suite n-to-m --case case1 --resharding-mode broadcast
      --resharding-loadbalance-mode loadbalance_order    one case with the reference's options
  reproflow aceso search --help          Aceso's search on a profiled database
  reproflow render --check               are the committed sbatch scripts current?
  reproflow submit param-comms --nodes 2 --image /apps/reproflow.sqsh --dry-run
  reproflow report                       tables (CSV, markdown) and figures (PNG, PDF)
"""


def _all_suites(checks: bool = True) -> list[Suite]:
    return [load_suite(p, checks=checks) for p in sorted((project_root() / "workflows").glob("*.toml"))]


def cmd_list(args: argparse.Namespace) -> int:
    """Print families with their parameters, then suites with their experiments and points."""
    if not args.suites:
        print("families:")
        for fam in families().values():
            print(f"  {fam.name}: {fam.summary}")
            for p in fam.params:
                print(f"      {p.name} = {canonical(p.default)!r}  ({p.allowed()}) {p.help}")
    # Points as declared: the families' cross-field checks (torch for some) run with `run --dry-run`.
    suites = [named_suite(s, checks=False) for s in args.suites] if args.suites else _all_suites(checks=False)
    print("suites:")
    for suite in suites:
        print(f"  {suite.name} ({suite.path}): {suite.description}")
        for exp in suite.experiments:
            la = exp.launch
            print(f"    {exp.name}: {exp.family}, {len(exp.points)} point(s), {la.nodes} node(s) x "
                  f"{la.procs_per_node} rank(s), backend {la.backend}, device {la.device}, repeats {la.repeats}")
            if args.suites or args.points:
                for point in exp.points:
                    print(f"      - {point.label}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a suite's experiments locally, one process group each (or show the plan, run nothing)."""
    return api.run_suite(args.suite, args.experiment, results=args.results, sets=args.set, nodes=args.nodes,
                         procs_per_node=args.procs_per_node, network=args.network, force=args.force,
                         dry_run=args.dry_run, explain=args.explain)


def cmd_render(args: argparse.Namespace) -> int:
    """Write (or with --check, compare) the sbatch script of each suite."""
    from reproflow.launch.render import render_sbatch, sbatch_path

    root = project_root()
    # A script follows from the suite's shape; the families' cross-field checks (torch for some, seconds
    # each) run with `run --dry-run` and in the job.
    suites = [named_suite(s, checks=False) for s in args.suites] if args.suites else _all_suites(checks=False)
    stale = []
    for suite in suites:
        text = render_sbatch(suite, root)
        path = sbatch_path(root, suite)
        own = suite.path.resolve() == (root / "workflows" / f"{suite.name}.toml").resolve()
        if not own and not args.check and path.exists():
            raise ReproflowError(f"{suite.path} is not the project's workflows/{suite.name}.toml, and "
                                 f"{path} is that suite's committed script: not overwritten. Rename the suite "
                                 "(its [suite] name or file), or submit it with `reproflow submit`.")
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        print(f"wrote {path}")
    if stale:
        print("out of date (run `make sbatch`): " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(suites)} sbatch script(s) match their templates")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit a suite's experiments to Slurm, one job each; with --wait or --retries, supervise them."""
    done = api.submission(args.suite, args.experiment, results=args.results, job=options.job(args), sets=args.set,
                          force=args.force, wait=args.wait, dry_run=args.dry_run)
    return 0 if done.ok else 1


def cmd_status(args: argparse.Namespace) -> int:
    """Print measured and failed points, and the Slurm state of submitted jobs."""
    from reproflow.launch import retry
    from reproflow.launch.status import experiment_status, sacct_jobs, submitted_jobs

    results = Path(args.results)
    rows = experiment_status(results)
    if not rows:
        print(f"no results under {results}")
    for row in rows:
        print(f"{row.suite}/{row.experiment}: {row.done} point(s) measured, {row.failed} failed")
    recorded = submitted_jobs(results)
    jobs = sacct_jobs(str(j["job_id"]) for j in recorded)
    if jobs is None:
        if recorded:
            print(f"{len(recorded)} submitted job(s); their states are unknown: sacct is not available here")
        return 0
    if jobs:
        print(f"{'JOBID':<12} {'STATE':<14} {'NAME':<44} {'NODES':<14} {'START':<19} END")
    for job in jobs:
        print(f"{job.job_id:<12} {job.state:<14} {job.name:<44} {job.nodelist:<14} {job.start:<19} {job.end}")
    # Why each unfinished job ended: the failure taxonomy, from its state, its log, its nodes' events.
    folders = {str(j["job_id"]): results / str(j["suite"]) / "jobs" for j in recorded}
    for job in jobs:
        if job.state in retry.FINAL_STATES - {"COMPLETED"}:
            folder = folders.get(job.job_id) or folders.get(job.job_id.split("_")[0])
            log = retry.job_log(folder, job.job_id) if folder else retry.batch_log(job)
            print("  " + retry.classify(job.job_id, job.state, log, *retry.failed_nodes(job, log)).line())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the cluster; exit 1 when something must be fixed before submitting."""
    from reproflow.launch.doctor import doctor

    failed = doctor(args.image, Path(args.results), args.nodes, args.runtime)
    print(f"reproflow doctor: {failed} problem(s) to fix" if failed else "reproflow doctor: ready to submit")
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    """Build tables and figures from every result under --results."""
    from reproflow.reporting.claims import METHOD, counts
    from reproflow.reporting.report import build_reports, check_claims

    if args.claims_only and args.reference:
        raise ReproflowError("--reference adds a section to the report page, which --claims-only does not write: "
                             "leave one of them out.")
    if args.claims_only:
        claims, written = check_claims(Path(args.results), Path(args.out))
        for c in claims:
            span = f" [{c.interval[0]:.3g}, {c.interval[1]:.3g}]" if c.interval else ""
            value = c.detail if c.deciding is None else (
                f"{c.measured:.3g}{span} ({c.threshold}; deciding: {c.deciding.label})"
                + (f": {c.not_applicable}" if c.not_applicable else ""))
            more = c.record()["samples to decide"]
            print(f"{c.status:19s} {c.family:12s} {c.statement}: {value}"
                  + (f"; samples to decide it: {more}" if more else ""))
        print(f"reproflow: {', '.join(f'{n} {s}' for s, n in counts(claims).items())} ({METHOD}); "
              f"{', '.join(str(p) for p in written)}")
        return 0
    references = [_published(name) for item in args.reference for name in item.split(",") if name]
    written = build_reports(Path(args.results), Path(args.out), args.family, references)
    for path in written:
        print(path)
    print(f"reproflow: {len(written)} files in {args.out}")
    page = Path(args.out) / "report.html"
    if not args.family:
        print(f"reproflow: report page {page} (self-contained) and {page.with_suffix('.md')}")
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """Print every family's claims as declared (markdown), and with --simulate the verdicts' error rates."""
    import pandas as pd

    from reproflow.reporting.claims import METHOD, spec_record
    from reproflow.reporting.page import to_markdown
    from reproflow.reporting.report import declared_claims

    print(f"Every claim, as its family declares it; each judged by one rule: {METHOD}.\n")
    print(to_markdown(pd.DataFrame([spec_record(s) for s in declared_claims()])))
    if args.simulate:
        from reproflow.reporting.simulation import SPREAD, table

        print(f"\nThe verdicts' rates, each design judged by the same rule on {args.simulate} simulated draws (seed "
              f"{args.seed}; `reproflow claims --simulate {args.simulate} --seed {args.seed}` prints the same). Every "
              f"sample log-normal with a {SPREAD:.0%} spread; null: every side as fast as the system, so a holds and a "
              "does not hold are both false; a 10 % effect either way says how often each verdict is reached. The "
              "designs marked 'not used' are the ways verdicts were drawn before one judge: the bound they break "
              "shows the simulation can tell.\n")
        print(to_markdown(pd.DataFrame(table(args.simulate, seed=args.seed)), floatfmt=".3f"))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run the reproduction plan's targets (all, or --only), then the report; or only estimate it."""
    from reproflow.app.reproduce.estimate import estimate, format_estimate
    from reproflow.app.reproduce.plan import PLAN, Folders, load_plan, step_argv
    from reproflow.app.reproduce.run import reproduce

    plan = load_plan(Path(args.plan) if args.plan else project_root() / PLAN)
    reference = Path(args.reference) if args.reference else None
    if reference is not None and not reference.is_dir():
        raise ReproflowError(f"--reference {reference} is not a folder. Give the folder holding the papers' "
                             "published results (e.g. aceso/reference-results/), or leave --reference out.")
    folders = Folders(Path(args.results), Path(args.reports), Path(args.logs), reference)
    only = [t for item in args.only for t in item.split(",") if t]
    targets, steps = plan.select(only)
    if args.estimate or args.dry_run:
        for target in targets:
            print(f"{target.name}: {target.title} (steps: {', '.join(target.steps)})")
        others = [t for t in plan.targets.values() if t not in targets]
        for target in others:
            print(f"{target.name}: {target.title} (not run: only when named, make {target.name}"
                  + (", with REFERENCE" if target.needs_reference else "") + ")")
        print()
        rows = estimate(steps, folders, args.executor)
        print(format_estimate(rows, args.executor))
        if args.dry_run:
            for step in steps:
                print(f"reproflow {' '.join(step_argv(step, folders, args.executor, options.job(args)))}")
            print(f"reproflow report --results {folders.results} --out {folders.reports}")
        return 0
    return reproduce(plan, only, folders, args.executor, options.job(args))


def cmd_archive(args: argparse.Namespace) -> int:
    """Write one .tar.gz of suites, scripts, results, logs and the report."""
    from reproflow.store.archive import write_archive

    path, files, left_out = write_archive(Path(args.out), project_root(), Path(args.results), Path(args.reports),
                                          Path(args.logs))
    print(f"reproflow: {path} ({files} files, {path.stat().st_size / 2**20:.1f} MiB): workflows/, sbatch/, "
          f"results/, logs/, reports/ and MANIFEST.json (sizes and SHA-256 of every file; environment records "
          f"redacted again)")
    for name, why in left_out.items():
        print(f"reproflow: left out {name}: {why} (MANIFEST.json names it)", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Set later runs against the first; exit 1 when a metric is slower beyond --fail-below."""
    import tempfile

    from reproflow.reporting import catalog
    from reproflow.reporting.compare import Reference, open_run, write_comparison

    if args.against_history:
        return _against_history(args)
    if len(args.runs) + bool(args.reference) < 2:
        raise ReproflowError(f"compare needs two runs or more, got {len(args.runs)}: give the first (the "
                             "baseline) and the ones to set against it, as results folders or archives; or one "
                             "run and --reference.")
    if args.fail_below is not None and not 0 < args.fail_below <= 1:
        raise ReproflowError(f"--fail-below {args.fail_below}: give the speed below which a metric fails, "
                             "between 0 and 1 (0.95: more than 5 % slower, the whole interval).")
    def compare(index: Any) -> tuple[list[Path], str, int]:
        with tempfile.TemporaryDirectory(prefix="reproflow-compare-") as scratch:
            try:
                first: list[Reference] = [Reference(_published(args.reference))] if args.reference else []
                match = first[0].match if first else tuple(f for f in args.match.split(",") if f)
                runs = [*first, *(open_run(source, index, Path(scratch), match, by_point=bool(first))
                                  for source in args.runs)]
                return write_comparison(runs, Path(args.out), args.fail_below, [Path(c) for c in args.claims])
            finally:
                catalog.forget(index, Path(scratch))

    paths, text, slower = catalog.using_index(compare)
    print(text)
    print(f"reproflow: {', '.join(str(p) for p in paths)}")
    if slower:
        print(f"reproflow: {slower} metric(s) slower than {args.fail_below:g} of the first run's (the whole "
              "interval) or not valid (the table's `why`); exit 1", file=sys.stderr)
    return 1 if slower else 0


def _against_history(args: argparse.Namespace) -> int:
    """`compare RUN --against-history`: the run against its cluster's own history, as `history --judge`."""
    from reproflow.reporting import catalog
    from reproflow.reporting.history import Selection, series

    if len(args.runs) != 1 or args.reference:
        raise ReproflowError("--against-history sets one run (its id) against the catalog's runs before it; give "
                             "one run id, no --reference.")
    folders = catalog.catalog_folders([])

    def read(index: Any) -> Any:
        catalog.refresh(index, folders)
        return series(index, folders, Selection())

    return _judge(catalog.using_index(read), args.runs[0], Path(args.out), args.last, args.alarm)


def _published(name: str) -> Any:
    """The published figure called `name` in the reference table, or an error listing them."""
    from reproflow.reporting.limits import LIMITS, limits

    table = limits().published
    if name not in table:
        raise ReproflowError(f"--reference {name!r} is not in {LIMITS}. Published figures there: "
                             f"{', '.join(sorted(table))}.")
    return table[name]


def cmd_runs(args: argparse.Namespace) -> int:
    """List the catalog's runs, newest first, with their headline figures."""
    from reproflow.reporting import catalog

    _check_dates(args)
    folders = catalog.catalog_folders(args.results)
    if not folders:
        print("reproflow: no runs recorded yet: `reproflow run`, `submit` and `reproduce` (make demo) record "
              "theirs; or give a results folder with --results")
        return 0
    def listing(index: Any) -> tuple[int, Any]:
        return catalog.refresh(index, folders, rescan=args.rescan), catalog.runs_table(
            index, folders, suite=args.suite, cluster=args.cluster, since=args.since, until=args.until,
            limit=args.limit)

    read, table = catalog.using_index(listing)
    for _, run in table.iterrows():
        print(f"{run['run']}  {run['start'][:19].replace('T', ' ')}  {run['state']}  {run['cluster'] or '-'}  "
              f"{run['points']} point(s), {run['failed']} failed  {run['hardware'] or '-'} on {run['nodes'] or '-'}"
              f"  commit {run['commit'] or '-'}")
        suites = run["suites"].split(",") if run["suites"] else ["-"]
        more = f" (+{len(suites) - 6} more)" if len(suites) > 6 else ""
        print(f"    suites: {','.join(suites[:6])}{more}")
        if run["headline"]:
            print(f"    {run['headline']}")
        if run["not_valid"]:
            print(f"    NOT VALID: {run['not_valid']}")
        print(f"    {run['folder']}")
    print(f"reproflow: {len(table)} run(s) listed from {len(folders)} results folder(s); index {catalog.index_path()} "
          f"({read} file(s) read again)")
    return 0


def _catalog_options(p: argparse.ArgumentParser) -> None:
    """The catalog's folders and the runs' cluster and dates, as `runs` and `history` take them."""
    p.add_argument("--results", action="append", default=[],
                   help="look only in this results folder (repeatable; default: every folder a run was recorded in)")
    p.add_argument("--cluster", default="", help="only runs on clusters whose name holds this")
    p.add_argument("--since", default="", help="only runs started on or after this date (YYYY-MM-DD)")
    p.add_argument("--until", default="", help="only runs started on or before this date (YYYY-MM-DD)")


def _gate_options(p: argparse.ArgumentParser, flag: str) -> None:
    """How a run is judged against its cluster's history (history --judge, compare --against-history)."""
    p.add_argument("--last", type=whole(2), default=20, help=f"with {flag}: comparable runs the interval is made of")
    p.add_argument("--alarm", type=number(), default=0.01,
                   help=f"with {flag}: the false-alarm rate a run may have, shared among its series (0.01)")


def _series_options(p: argparse.ArgumentParser) -> None:
    """Which points, as `history` and `nodes` take them: globs on suite, experiment and point."""
    p.add_argument("--suite", default="*", help="suites matching this glob")
    p.add_argument("--experiment", default="*", help="experiments matching this glob")
    p.add_argument("--point", default="*", help="points matching this glob, as named in their rows "
                                                "(collective=all_reduce)")


def cmd_history(args: argparse.Namespace) -> int:
    """A metric's values run after run and its change points; exit 1 with --fail-on-change on a worse one."""
    from reproflow.reporting import catalog
    from reproflow.reporting.history import Selection, series, write_history

    _check_dates(args)
    folders = catalog.catalog_folders(args.results)
    chosen = Selection(args.suite, args.experiment, args.point, args.coords, args.metric, args.cluster, args.nodes,
                       args.since, args.until)

    def read(index: Any) -> Any:
        catalog.refresh(index, folders)
        return series(index, folders, chosen)

    if not folders:
        raise ReproflowError("no runs recorded yet: `reproflow run`, `submit` and `reproduce` (make demo) record "
                             "theirs; or give a results folder with --results.")
    if args.judge:
        return _judge(catalog.using_index(read), args.judge, Path(args.out), args.last, args.alarm)
    paths, text, points = write_history(catalog.using_index(read), Path(args.out))
    print(text)
    print(f"reproflow: {', '.join(str(p) for p in paths[:4])} and {len(paths) - 4} figure(s)")
    worse = int((points["change"] == "worse").sum()) if len(points) else 0
    if args.fail_on_change and worse:
        print(f"reproflow: {worse} change(s) made a series worse; exit 1", file=sys.stderr)
        return 1
    return 0


def _judge(rows: Any, run: str, out: Path, last: int, alarm: float) -> int:
    """A run against its cluster's history (history --judge, compare --against-history): 1 when a series is
    worse or not valid."""
    from reproflow.reporting.nightly import FAILS, judge, write_judgement

    table = judge(rows, run, last, alarm)
    path, text = write_judgement(table, run, out, last, alarm)
    print(text)
    print(f"reproflow: {path}")
    failing = int(table["verdict"].isin(FAILS).sum())
    if failing:
        print(f"reproflow: {failing} series worse than this cluster's history or not valid; exit 1", file=sys.stderr)
    return 1 if failing else 0


def cmd_nodes(args: argparse.Namespace) -> int:
    """The nodes slower than their peers across the catalog's runs; exit 1 with --fail-on-suspect if any."""
    from reproflow.reporting import catalog
    from reproflow.reporting.history import Selection
    from reproflow.reporting.nodes import residuals, suspects, write_nodes

    _check_dates(args)
    folders = catalog.catalog_folders(args.results)
    if not folders:
        raise ReproflowError("no runs recorded yet: `reproflow run`, `submit` and `reproduce` (make demo) record "
                             "theirs; or give a results folder with --results.")
    chosen = Selection(args.suite, args.experiment, args.point, "*", args.metric, args.cluster, 0, args.since,
                       args.until)

    def read(index: Any) -> Any:
        catalog.refresh(index, folders)
        return residuals(index, folders, chosen)

    table = suspects(catalog.using_index(read), args.margin)
    paths, text = write_nodes(table, Path(args.out), args.margin)
    print(text)
    print(f"reproflow: {', '.join(str(p) for p in paths)}")
    return 1 if args.fail_on_suspect and (table["verdict"] == "suspect").any() else 0


def _check_dates(args: argparse.Namespace) -> None:
    import datetime as _dt

    for flag in ("since", "until"):
        value = getattr(args, flag)
        try:
            value and _dt.date.fromisoformat(value)
        except ValueError:
            raise ReproflowError(f"--{flag} {value!r}: give a date as YYYY-MM-DD (2026-11-26).") from None


def _targets_help() -> str:
    """The plan's targets, for `reproflow reproduce --help`."""
    from reproflow.app.reproduce.plan import PLAN, load_plan

    try:
        plan = load_plan(project_root() / PLAN)
    except ReproflowError as exc:
        return f"(targets unavailable: {exc})"
    return "\n".join(f"  {t.name:<20} {t.title}" for t in plan.targets.values())


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults that say something (not None, False or an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, []) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    fmt = _Help
    parser = argparse.ArgumentParser(
        prog="reproflow", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Reproduce distributed deep-learning experiments from suite files "
                    "(workflows/*.toml): locally, or on Slurm through the committed sbatch scripts or "
                    "`reproflow submit`.")
    parser.add_argument("--version", action="version", version=f"reproflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="families, suites and points", formatter_class=fmt,
                       description="List families (with parameters and defaults) and suites (with points).")
    p.add_argument("suites", nargs="*", help="suite names or files (default: every suite in workflows/)")
    p.add_argument("--points", action="store_true", help="also list every point of every suite")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="run a suite on this machine", formatter_class=fmt,
                       description="Run a suite's experiments here: each experiment is one process group of "
                                   "nodes x procs_per_node ranks (gloo on CPU, NCCL on GPUs). Points with "
                                   "results are skipped unless --force.")
    options.run_options(p, with_suite=True)
    p.set_defaults(func=cmd_run)

    for name in family_names():
        # A family's own subcommands: its `cli` module, looked up by name (no family stack imported).
        if importlib.util.find_spec(f"{PACKAGE}.{name}.cli") is not None:
            importlib.import_module(f"{PACKAGE}.{name}.cli").register_cli(sub, fmt)

    p = sub.add_parser("render", help="write sbatch/<suite>.sbatch from templates/", formatter_class=fmt,
                       description="Render each suite's sbatch script from templates/suite.sbatch.j2.")
    p.add_argument("suites", nargs="*", help="suite names or files (default: every suite)")
    p.add_argument("--check", action="store_true", help="only compare with the committed scripts; exit 1 if stale")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("submit", help="submit a suite to Slurm, one job per experiment", formatter_class=fmt,
                       description="Submit one Slurm job per experiment: the suite's job script (templates/job.sh "
                                   "after the job's #SBATCH lines) for that experiment, as sbatch/<suite>.sbatch "
                                   "runs them all; --dry-run prints it.")
    options.suite_options(p)
    options.rank_options(p, "nodes per job")
    options.job_options(p)
    p.add_argument("--wait", action="store_true",
                   help="wait for the jobs and classify how each ended: infrastructure (node failure, preemption, "
                        "communicator or health-gate failure), experiment (exception, out of memory, invalid "
                        "result), time limit or cancelled; exit 1 unless all completed")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("doctor", help="check the cluster before submitting", formatter_class=fmt,
                       description="Check Slurm (commands, controller, nodes, accounting); with --image, the "
                                   "container runtime (Pyxis with enroot and unsquashfs, Slurm's OCI support, or "
                                   "Apptainer) and the squash file; that --results is shared by the nodes, GPUs "
                                   "and MPI. Prints the fix for each problem; exits 1 if any must be fixed.")
    p.add_argument("--image", default="", help="squash file the jobs will use")
    p.add_argument("--runtime", choices=("pyxis", "oci", "apptainer"), default="pyxis",
                   help="container runtime the jobs will use (with --image)")
    p.add_argument("--results", default="results", help="results folder the jobs will write")
    p.add_argument("--nodes", type=whole(1), default=2, help="nodes to read the results folder from")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("status", help="measured points and Slurm job states", formatter_class=fmt,
                       description="Count measured and failed points; show sacct states of submitted jobs.")
    p.add_argument("--results", default="results", help="results folder")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="tables and figures from the results", formatter_class=fmt,
                       description="Aggregate every CSV under --results into tables (CSV + markdown) and "
                                   "figures (PNG + PDF) with each family's report module, check the "
                                   "papers' claims (claims.csv) and write the report page: report.html, "
                                   "self-contained, and its markdown twin report.md.")
    p.add_argument("--results", default="results", help="results folder")
    p.add_argument("--out", default="reports", help="where tables and figures go")
    p.add_argument("--family", action="append", default=[],
                   help="only this family's tables and figures, no page (repeatable)")
    p.add_argument("--claims-only", action="store_true",
                   help="only check the claims again on the rows (claims.csv, claims.md) and print them")
    p.add_argument("--reference", action="append", default=[], metavar="NAME",
                   help="a section (and reference_NAME.md) setting the results against this published figure of "
                        "workflows/reference/limits.toml, e.g. p5-2node (comma-separated or repeated)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("claims", help="every claim as declared: design, selection, error control, threshold",
                       formatter_class=fmt,
                       description="Print the table of every family's claims (markdown): what is compared with what, "
                                   "the design of the comparison, how a best-of-several is chosen, how the verdict's "
                                   "error rates are held, where it applies, its threshold and the paper's figure.")
    p.add_argument("--simulate", type=int, default=0, metavar="N",
                   help="also the verdicts' error rates, each design judged on N simulated draws")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated draws")
    p.set_defaults(func=cmd_claims)

    p = sub.add_parser("reproduce", help="every family's small suites, then the report page with the claims",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run the targets of workflows/reproduce/targets.toml (every paper figure and "
                                   "table at the scale of this machine) here, or submit them to Slurm; points "
                                   "already measured are skipped. Shows points done / total, the current "
                                   "point, elapsed and estimated time; ends with a summary, the report page "
                                   "(report.html, report.md) and the claims: holds / does not hold / not "
                                   "measured.\n\ntargets (make <target> runs one):\n" + _targets_help())
    p.add_argument("--plan", default="", help="a plan file of your own (default: workflows/reproduce/targets.toml)")
    p.add_argument("--only", action="append", default=[], metavar="TARGET",
                   help="only these targets (comma-separated or repeated); default: all")
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="local: here (default); slurm: submit every step, wait for the jobs, then draw here")
    p.add_argument("--estimate", action="store_true",
                   help="print each step's points, minutes and node-hours (expected, from earlier runs here or "
                        "the plan's 2-core estimates), run and submit nothing")
    p.add_argument("--dry-run", action="store_true", help="print the estimate and the commands, run nothing")
    p.add_argument("--results", default="results", help="results folder (default: %(default)s)")
    p.add_argument("--reports", default="reports", help="tables, figures and the report page (default: %(default)s)")
    p.add_argument("--logs", default="logs", help="step logs, Aceso's and CFP's work folders (default: %(default)s)")
    p.add_argument("--reference", default="",
                   help="folder of the papers' published results (aceso/reference-results/...), drawn beside "
                        "the reproduced figures")
    options.job_options(p, "with --executor slurm: ")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("archive", help="one .tar.gz of suites, scripts, results, logs and the report",
                       formatter_class=fmt,
                       description="Pack workflows/, sbatch/, --results, --logs and --reports into one compressed "
                                   "archive with a MANIFEST.json (size and SHA-256 of every file, commit), to share "
                                   "a reproduction or attach it to a paper's artifact.")
    p.add_argument("--out", default="reproflow-archive.tar.gz", help="archive file")
    p.add_argument("--results", default="results", help="results folder")
    p.add_argument("--reports", default="reports", help="report folder")
    p.add_argument("--logs", default="logs", help="logs folder")
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("runs", help="the runs recorded here, newest first, with their headline figures",
                       formatter_class=fmt,
                       description="List the runs of `reproflow run`, `submit` and `reproduce` (make demo) from the "
                                   "catalog: id, start, how it ended, cluster, points measured and failed, each "
                                   "family's headline figure, hardware, commit, results folder. The catalog's index "
                                   "(SQLite) is brought up to date from the result files first; the files stay the "
                                   "truth. Runs whose jobs were submitted by hand are listed from their rows.")
    _catalog_options(p)
    p.add_argument("--suite", default="", help="only runs of suites matching this glob (comms*, param-demo)")
    p.add_argument("--limit", type=whole(0), default=0, help="at most this many runs (0: all)")
    p.add_argument("--rescan", action="store_true",
                   help="check every file's time, not only the folders' (for result files edited in place)")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("history", help="a metric run after run, and the runs where it changed",
                       formatter_class=fmt,
                       description="For the series selected (a point's metric across the catalog's runs, in start "
                                   "order): each run's geometric mean with its 95 % interval, and the change points "
                                   "(PELT) with the runs either side, the ratio after / before with its "
                                   "interval and what the rows say differs across it (commit, image, versions, "
                                   "nodes). Writes history.md, a self-contained history.html with a figure per "
                                   "series, history.csv and change_points.csv.")
    _catalog_options(p)
    _series_options(p)
    p.add_argument("--coords", default="*", help="coordinates: NAME=VALUE pairs matched exactly "
                   "(size_bytes=1048576), or a glob on their JSON text")
    p.add_argument("--metric", default="", help="the metric (default: each family's headline: busbw, tflops, ...)")
    p.add_argument("--nodes", type=whole(0), default=0, help="only points measured on this many nodes (0: any)")
    p.add_argument("--out", default="history", help="where the page, tables and figures go")
    p.add_argument("--fail-on-change", action="store_true",
                   help="exit 1 when a change made a series worse (the whole interval of its ratio on the worse "
                        "side of 1): for a nightly check")
    p.add_argument("--judge", default="", metavar="RUN",
                   help="is this run normal for its cluster? each of its series against a prediction interval from "
                        "the valid runs before it with the same cluster and node count (judge.csv in --out); exit 1 "
                        "when one is worse or not valid: the nightly gate")
    _gate_options(p, "--judge")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("nodes", help="nodes whose ranks are slower than their peers', across runs",
                       formatter_class=fmt,
                       description="From the per-rank times of multi-node points in the catalog's runs (a rank's "
                                   "compute or step time, per rank and repeat): each node's slowdown against its "
                                   "peers once the run's and the rank's own effects are taken out (median polish), "
                                   "with its interval over the runs it ran in, how often it was its run's slowest, "
                                   "and the suspects (the whole interval above 1 + margin). Writes nodes.md, "
                                   "nodes.csv, nodes.html and exclude.txt for `reproflow submit --exclude @...` or "
                                   "`sbatch --exclude=$(cat ...)`.")
    _catalog_options(p)
    _series_options(p)
    p.add_argument("--metric", default="", help="only this per-rank time (default: every one)")
    p.add_argument("--margin", type=number(0), default=0.02,
                   help="how much slower than its peers a node must be, over its whole interval (0.02: 2 %%)")
    p.add_argument("--out", default="nodes", help="where the tables and exclude.txt go")
    p.add_argument("--fail-on-suspect", action="store_true", help="exit 1 when a node is suspect")
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("compare", help="runs against runs: ratios with intervals, faster / slower / same",
                       formatter_class=fmt,
                       description="Set each later run against the first: points matched by suite, experiment, "
                                   "parameters and metric; per metric the ratio of the repeats' geometric means "
                                   "with its 95 % interval and a verdict (a rate better higher, a time lower); "
                                   "points in one run only listed; what differs in the runs' provenance first. "
                                   "Writes compare.md and a self-contained compare.html with the runs' curves "
                                   "overlaid.")
    p.add_argument("runs", nargs="+", help="run ids (`reproflow runs`), results folders or `reproflow archive` "
                                           "files; the first is the baseline")
    p.add_argument("--out", default="compare", help="folder for compare.md, compare.html and the figures")
    p.add_argument("--claims", nargs="+", default=[], metavar="CLAIMS_CSV",
                   help="each run's claims.csv (from its report), in the runs' order: their verdicts side by side")
    p.add_argument("--match", default="",
                   help="match points by these parameters and coordinates only (comma-separated, e.g. "
                        "kernel,dtype,implementation,m,n,k), whatever their suites and experiments are called: "
                        "one machine's rows against another's")
    p.add_argument("--reference", default="",
                   help="set the runs against a published figure of workflows/reference/limits.toml "
                        "(e.g. param-gemm-fp32-gpu), matched by the parameters it was published at")
    p.add_argument("--fail-below", type=number(), default=None,
                   help="exit 1 when a metric's speed against the first run is below this with its whole "
                   "interval (0.95: more than 5 %% slower); default: off")
    p.add_argument("--against-history", action="store_true",
                   help="one run (its id) against its cluster's own history, as `history --judge RUN`: exit 1 "
                        "when a series is worse or not valid")
    _gate_options(p, "--against-history")
    p.set_defaults(func=cmd_compare)
    return parser


def _recorded(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run a command that measures (run, submit, reproduce, a family's commands that run suites) as a run
    of the catalog: an id its rows carry, and a manifest written here, by the invoking process, at its
    start and its end."""
    import platform

    from reproflow.launch.status import cluster_name
    from reproflow.store.runs import SUBMITTED, recorded_run

    submits = args.command == "submit" or bool(getattr(args, "submit", False))
    executor = getattr(args, "executor", "slurm" if submits else "local")
    cluster = (cluster_name() or "slurm") if executor == "slurm" else f"local ({platform.node()})"
    suites = [args.suite] if getattr(args, "suite", None) else [t for item in getattr(args, "only", []) for t
                                                                in item.split(",") if t]
    with recorded_run(Path(args.results), argv, suites=suites, cluster=cluster, executor=executor,
                      nodes=getattr(args, "nodes", None), image=getattr(args, "image", ""),
                      keep_empty=args.command in ("run", "submit", "reproduce")) as record:
        if submits and not (getattr(args, "wait", False) or getattr(args, "retries", 0)):
            record["ends_as"] = SUBMITTED
        record["exit_code"] = code = int(args.func(args))
    return code


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (Slurm's time limit, a supervisor, a closed terminal), taken as Ctrl-C is: the
    ranks this run started are stopped and its manifest says it was interrupted."""


def _stopped(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def _argv_problem(argv: list[str]) -> str:
    """The first argument no command takes, whatever the option: every value may reach a job script, a
    file name or a terminal, so none holds a control character or bytes that are not UTF-8."""
    for i, arg in enumerate(argv):
        problem = text_problem(arg)
        if problem:
            if arg.startswith("--") and "=" in arg:
                name = arg.split("=", 1)[0]
            else:
                name = argv[i - 1] if i and argv[i - 1].startswith("-") else f"argument {i + 1}"
            name = shown(name, 40) if text_problem(name) else name
            return f"{name} {shown(arg)} {problem}. Give plain text on one line."
    return ""


class _Printable(io.TextIOBase):
    """A text stream that writes to `stream` what a terminal shows as it is (spec.errors.printable)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: everything it prints goes through `printable`."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(sys.stdout), _Printable(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = _argv_problem(argv)
    if problem:
        print(f"reproflow: error: {problem}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    measures = (args.command in ("run", "submit", "reproduce") or getattr(args, "measures", False)) and not any(
        getattr(args, flag, False) for flag in ("dry_run", "explain", "estimate"))
    before = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _recorded(args, argv) if measures else int(args.func(args))
    except (ReproflowError, ParamError) as exc:
        print(f"reproflow: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path given that the system refuses: too long, not permitted, a folder for a file
        if exc.filename is None:
            raise
        print(f"reproflow: error: {str(exc.filename)[:200]}: {exc.strerror}. Check the path given.", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        name = str(exc) if isinstance(exc, Stopped) else "SIGINT"
        print(f"reproflow: interrupted ({name}); finished points are kept", file=sys.stderr)
        return 128 + signal.Signals[name]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
