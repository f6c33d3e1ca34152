"""The Python API: what the command line does, for notebooks and submitit users.

A suite is named as on the command line (`param-demo` is workflows/param-demo.toml) or given by
path; `overrides` fix a parameter for every point, as `--set` does. Every function returns what a
script needs next (an exit code, job ids, a pandas frame, files) and raises ReproflowError, with the
field and the fix in its message, on bad input.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reproflow.launch.job import Job
from reproflow.rank.startup import EXIT_STARTUP
from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.family import get_family
from reproflow.spec.paths import project_root
from reproflow.spec.suite import NAME_RE, Experiment, Suite, named_suite, override_strings
from reproflow.store import events
from reproflow.store.files import held
from reproflow.store.results import writable_results, writer_lock
from reproflow.store.runs import RUN_ID_ENV, now

if TYPE_CHECKING:
    import pandas as pd

    from reproflow.launch.local import LocalExecutor
    from reproflow.launch.retry import Verdict
    from reproflow.launch.submit import SlurmExecutor
    from reproflow.reporting.claims import Claim


def load_suite(suite: str | Path, overrides: Mapping[str, Any] | None = None) -> Suite:
    """The suite with its experiments and points (parameters resolved), without running anything."""
    return named_suite(str(suite), override_strings(overrides or {}))


def run_suite(suite: str | Path, experiments: Sequence[str] = (), *, results: str | Path = "results",
              overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = (), nodes: int | None = None,
              procs_per_node: int | None = None, network: str | None = None, force: bool = False, dry_run: bool = False,
              explain: bool = False) -> int:
    """Run the suite's experiments (all, or those named) on this machine, one process group each;
    points measured before are skipped unless `force`. Returns 0, or the first failing exit code.

    `sets` are `--set` strings (KEY=VALUE), applied after `overrides`. With `dry_run`, print each
    rank's command; with `explain`, each point's plan; neither runs anything."""
    from reproflow.launch.local import LocalExecutor

    sets = [*override_strings(overrides or {}), *sets]
    loaded = named_suite(str(suite), sets)
    executor = LocalExecutor(Path(results), project_root(), force, tuple(sets), network, nodes, procs_per_node)
    if dry_run or explain:
        _show_run(loaded, list(experiments), executor, explain)
        return 0
    selected = loaded.select(list(experiments))  # a name that is not there: refused before anything is written
    worst = 0
    with writing(results, loaded.name):
        keep_suite(loaded, Path(results))
        for exp in selected:
            code = _run_experiment(executor, loaded, exp)
            worst = worst or code
    print(f"reproflow: results of suite {loaded.name} are in {Path(results) / loaded.name}")
    return worst


def _run_experiment(executor: LocalExecutor, suite: Suite, exp: Experiment) -> int:
    """One experiment on this machine; its exit code, as a shell reports it."""
    hosts = executor.nodes or exp.launch.nodes
    if hosts > 1:
        print(f"reproflow: {exp.name}: {hosts} nodes x {executor.host_size(exp)} rank(s), all "
              f"{executor.world_size(exp)} ranks on this machine as emulated hosts (use `reproflow submit` or "
              "sbatch for real nodes)")
    code = executor.run(suite, exp)
    if code < 0:  # a rank killed by a signal: report it as a shell does (128 + signal)
        print(f"reproflow: experiment {exp.name} ended: a rank was killed by signal {-code}", file=sys.stderr)
        code = 128 - code
    elif code:
        why = {3: " (some points failed; see *.failed.json)",
               EXIT_STARTUP: f" (its ranks did not start within launch.startup_s = {exp.launch.startup_s:g} s)"}
        print(f"reproflow: experiment {exp.name} ended with exit code {code}{why.get(code, '')}", file=sys.stderr)
    return code


@contextlib.contextmanager
def writing(results: str | Path, suite: str) -> Iterator[None]:
    """Hold `suite`'s results under `results` for this process while the block runs (a run, a submit and
    its wait): one writer at a time, since two would replace each other's rows. Another process's run or
    submit of that suite into that folder meanwhile is refused, naming this one; so is a folder that is
    not a results folder."""
    writable_results(Path(results))
    with held(writer_lock(Path(results), suite), _owner(), under=Path(results)):
        yield


def keep_suite(suite: Suite, results: Path) -> None:
    """A suite file from outside the checkout's workflows/ copied beside its results, as `<results>/<name>.toml`
    (where generated suites are written), so that the results folder, and an archive of it, holds every
    suite its rows came from."""
    from reproflow.store.files import atomic_write, read_regular

    kept = results / f"{suite.name}.toml"
    source = suite.path.resolve()
    if source.is_relative_to((project_root() / "workflows").resolve()) or source == kept.resolve():
        return
    try:
        atomic_write(kept, read_regular(suite.path).decode(), under=results)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"reproflow: {suite.path} not kept beside the results ({exc}); an archive will lack it", file=sys.stderr)


def _owner() -> str:
    """Who holds a suite's results while a run writes them, as a second run is told."""
    return (f"run {os.environ.get(RUN_ID_ENV) or '(no run id)'} (pid {os.getpid()} on {socket.gethostname()}, "
            f"since {now()})")


def _show_run(suite: Suite, experiments: list[str], executor: LocalExecutor, explain: bool) -> None:
    """Print what run_suite would start (each rank's command), or each point's plan, running nothing."""
    from reproflow.launch.local import worker_args

    for exp in suite.select(experiments):
        if explain:
            _explain(exp, executor.host_size(exp))
            if plan := executor.network_plan(exp):
                print(f"  {plan}")
            continue
        world = executor.world_size(exp)
        print(f"# {exp.name}: {world} local rank(s), {len(exp.points)} point(s)")
        if plan := executor.network_plan(exp):
            print(f"# {plan}")
        launcher = (f"mpirun -np {world} python -m mpi4py" if exp.launch.launcher == "mpi"
                    else f"RANK=<0..{world - 1}> WORLD_SIZE={world} MASTER_ADDR=127.0.0.1 python")
        print(f"{launcher} -m reproflow.worker "
              + shlex.join(worker_args(suite, exp, executor.results, executor.force, executor.root, executor.sets)))
        for point in exp.points:
            print(f"    {point.label}")


def _explain(exp: Experiment, host_size: int) -> None:
    """Print the family's plan of every point, computed as the ranks would compute it."""
    fam = get_family(exp.family)
    print(f"# {exp.name}: {len(exp.points)} point(s), {exp.launch.nodes} host(s) x {host_size} rank(s)")
    for point in exp.points:
        print(f"- {point.label}")
        if fam.explain is None:
            print(f"  (family {fam.name} has no plan to explain; --dry-run shows the command)")
            continue
        try:
            print(textwrap.indent(fam.explain(point.params, host_size), "  "))
        except ParamError as exc:
            print(f"  cannot plan this point: {exc}")


def submit_suite(suite: str | Path, experiments: Sequence[str] = (), *, results: str | Path = "results",
                 job: Job | None = None, overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = (),
                 force: bool = False, wait: bool = False, dry_run: bool = False) -> list[str]:
    """Submit the suite's experiments to Slurm, each as one job of the options `job` holds (`results` must
    be on storage the nodes share); returns the Slurm job ids. With `wait` or `job.retries`, waits for
    them and resubmits jobs that failed for the infrastructure (at most `job.retries` times, without the
    failed nodes); `dry_run`: print each job's script, submit nothing."""
    return submission(suite, experiments, results=results, job=job, overrides=overrides, sets=sets, force=force,
                      wait=wait, dry_run=dry_run).job_ids


@dataclass(frozen=True)
class Submission:
    """What a submission did: the job ids, and the verdicts on the last attempt of each job waited for."""

    job_ids: list[str]
    verdicts: list[Verdict]

    @property
    def ok(self) -> bool:
        return all(v.category == "ok" for v in self.verdicts)


def submission(suite: str | Path, experiments: Sequence[str] = (), *, results: str | Path = "results",
               job: Job | None = None, overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = (),
               force: bool = False, wait: bool = False, dry_run: bool = False) -> Submission:
    """submit_suite, with the verdicts on the jobs it waited for (`reproflow submit` exits on them)."""
    loaded = named_suite(str(suite), [*override_strings(overrides or {}), *sets])
    selected = loaded.select(list(experiments))
    executor = slurm_executor(results, job=job, overrides=overrides, sets=sets, force=force)
    if dry_run:
        for exp in selected:
            print(f"# {loaded.name} / {exp.name}: {len(exp.points)} point(s); the job script sbatch would get:")
            print(executor.dry_run(loaded, exp))
        return Submission([], [])
    with writing(results, loaded.name):  # while submitting, and while waiting for the jobs when told to
        keep_suite(loaded, Path(results))
        if wait or executor.job.retries:
            return _supervised(executor, loaded, selected)
        ids: list[str] = []
        for exp in selected:
            submitted = executor.submit(loaded, exp)
            if not submitted:
                continue
            shown = (f"array {submitted[0].split('_')[0]} ({len(submitted)} tasks)" if executor.job.array
                     else submitted[0])
            print(f"submitted {loaded.name} / {exp.name} as Slurm job {shown}")
            print(f"job ids: {','.join(submitted)}")
            ids += submitted
        return Submission(ids, [])


def _supervised(executor: SlurmExecutor, loaded: Suite, selected: list[Experiment]) -> Submission:
    """Submit each experiment, wait for its jobs and resubmit those that failed for the infrastructure;
    a line per experiment saying how it ended."""
    ids: list[str] = []
    verdicts: list[Verdict] = []
    for exp in selected:
        attempts = executor.supervise(loaded, exp)
        if not attempts:
            continue
        ids += [j for attempt in attempts for j in attempt.job_ids]
        verdicts += attempts[-1].verdicts
        retried = len(attempts) - 1
        outcome = ", ".join(sorted({v.category for v in attempts[-1].verdicts})) or "unknown"
        tagged = f" ({retried} retr{'y' if retried == 1 else 'ies'}; rows tagged attempt, retry_of)" if retried else ""
        print(f"reproflow: {loaded.name} / {exp.name}: {outcome} after {len(attempts)} attempt(s){tagged}")
    return Submission(ids, verdicts)


def slurm_executor(results: str | Path = "results", *, job: Job | None = None,
                   overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = (),
                   force: bool = False) -> SlurmExecutor:
    """The executor that submit_suite submits with."""
    from reproflow.launch.submit import SlurmExecutor

    return SlurmExecutor(results=Path(results), root=project_root(), job=job or Job(), force=force,
                         sets=tuple([*override_strings(overrides or {}), *sets]))


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a suite that a family command writes runs: here, or submitted to Slurm after some jobs."""

    results: Path = Path("results")
    submit: bool = False
    job: Job = field(default_factory=Job)  # with `submit`: how the jobs run, after which jobs
    force: bool = False
    dry_run: bool = False

    def following(self, job_ids: Sequence[str]) -> Placement:
        """The same placement, its jobs starting after `job_ids` succeed."""
        return replace(self, job=replace(self.job, after=tuple(job_ids)))


def run_generated_suite(text: str, name: str, where: Placement) -> list[str]:
    """Write a generated suite under `where.results` and run it here, or submit it; returns the submitted
    job ids (none when run here). Reruns skip the points already measured. A dry run leaves the results
    folder as it found it."""
    from reproflow.store.files import atomic_write

    if not NAME_RE.fullmatch(name):  # checked before anything is written: a name with '/' would lead out
        raise ReproflowError(f"the generated suite's name {name[:80]!r} cannot name a file: it comes from the "
                             "options given (models, sizes, meshes such as --mesh 2x2); give values of letters, "
                             "digits, 'x', ',' and '.' only.")
    suite = where.results / f"{name}.toml"
    if where.dry_run:
        with _for_a_dry_run(suite, text):
            return _run_generated(suite, where)
    atomic_write(suite, text, under=where.results)
    return _run_generated(suite, where)


@contextlib.contextmanager
def _for_a_dry_run(suite: Path, text: str) -> Iterator[None]:
    """The generated suite written for a dry run to read, and the results folder left as it was found
    afterwards, whatever the run did: the suite removed, or the one it replaced put back."""
    from reproflow.store.files import atomic_write, read_regular

    folder = suite.parent
    made = not folder.exists()
    try:
        before = read_regular(suite).decode() if suite.is_file() and not suite.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        before = None
    atomic_write(suite, text, under=folder)
    try:
        yield
    finally:
        if before is None:
            suite.unlink(missing_ok=True)
        elif before != text:
            atomic_write(suite, before, under=folder)
        if made:
            with contextlib.suppress(OSError):  # not empty: something else wrote there meanwhile
                folder.rmdir()


def _run_generated(suite: Path, where: Placement) -> list[str]:
    if not where.submit:
        code = run_suite(suite, results=where.results, force=where.force, dry_run=where.dry_run)
        if code:
            raise ReproflowError(f"the generated suite {suite} failed (exit {code}); its log is above.")
        return []
    # A generated suite is a pipeline (CFP's analysis -> profile -> search): each experiment's jobs start
    # after the previous experiment's succeed, in the order a run here takes them.
    ids: list[str] = []
    for exp in named_suite(str(suite), []).experiments:
        submitted = submit_suite(suite, [exp.name], results=where.results, job=where.job, force=where.force,
                                 dry_run=where.dry_run)
        where = where.following(submitted) if submitted else where
        ids += submitted
    return ids


def submit_call(name: str, fn: Callable[..., Any], *args: Any, folder: str | Path, minutes: int,
                where: Placement) -> str:
    """Submit `fn(*args)` as a one-task Slurm job (a pipeline step that is not a suite, e.g. Aceso's
    search) as its suites are submitted: in the image, partition and dependencies of `where.job`.
    Returns the job id."""
    executor = slurm_executor(where.results, job=where.job)
    job_id = executor.submit_call(name, fn, *args, folder=Path(folder), minutes=minutes)
    events.emit("submitted", job_ids=[job_id])
    return job_id


def read_results(folder: str | Path = "results") -> pd.DataFrame:
    """Every row under the results folder as one long frame (torn files quarantined, points whose job
    failed its health gate left out), as the report reads them."""
    from reproflow.reporting.report import load_results

    return load_results(Path(folder))


def build_report(folder: str | Path = "results", out: str | Path = "reports",
                 families: Sequence[str] = ()) -> list[Path]:
    """Tables, figures, the claims and the report page (report.html, report.md) from the rows under
    `folder` into `out`; with `families`, only their tables and figures. Returns the files written."""
    from reproflow.reporting.report import build_reports

    return build_reports(Path(folder), Path(out), families)


def check_claims(folder: str | Path = "results", out: str | Path = "reports") -> list[Claim]:
    """The papers' claims checked again on the rows under `folder` (claims.csv and .md rewritten in `out`)."""
    from reproflow.reporting import report

    return report.check_claims(Path(folder), Path(out))[0]
