"""Slurm executor: one job per experiment, its script the suite's job script for that experiment.

Each job is templates/job.sh with the #SBATCH lines and variables of its `Job` before it, the same
job a committed sbatch/<suite>.sbatch runs (render.py), submitted with sbatch: every container runtime
(Pyxis, Slurm's OCI support, Apptainer) and every launcher (torchrun, srun's MPI, mpirun_rsh, hydra)
works on both paths. A pipeline step that is a Python call, not a suite (Aceso's search), goes
through submitit with the same options.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reproflow.launch import retry
from reproflow.launch.containers import image_problem, runtime_problems
from reproflow.launch.job import Job
from reproflow.launch.render import JobScript, render_job, shell_value
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import Experiment, Point, Suite, format_slurm_time, slurm_seconds
from reproflow.store import events
from reproflow.store.files import append_line, atomic_write
from reproflow.store.results import point_file_problem, point_path
from reproflow.store.runs import RUN_ID_ENV

# What the submitting process hands its jobs through --export=NONE: the run the rows join, and the
# reliability tests' fault hook (crossing on purpose).
_PASSED_ON = (RUN_ID_ENV, "REPROFLOW_INJECT_FAULT")


@dataclass(frozen=True, kw_only=True)
class SlurmExecutor:
    """Submit a suite's experiments to Slurm (`reproflow submit`), each as the job `job` describes."""

    results: Path
    root: Path
    job: Job = field(default_factory=Job)
    force: bool = False
    sets: tuple[str, ...] = ()
    # Set on retries: which attempt this is and the job it retries.
    attempt: int = 1
    retry_of: str = ""

    def __post_init__(self) -> None:
        shell_value("--results", str(self.results))  # a newline would end the line of the script it is on

    def folder(self, suite: Suite) -> Path:
        """Where this suite's job scripts and job logs (`<job id>.out`) go."""
        return (self.results / suite.name / "jobs").resolve()

    def shape(self, exp: Experiment) -> tuple[int, int]:
        """(nodes, ranks per node) of the experiment's job."""
        return self.job.nodes or exp.launch.nodes, self.job.procs_per_node or exp.launch.procs_per_node

    def script(self, suite: Suite, exp: Experiment, points: list[int] | None = None, *, write: bool = True) -> str:
        """The job script of one experiment; with the job's `array`, one task per index in `points`
        (default: every point). `write`: copy the suite where an image's job reads it (_visible)."""
        job, launch = self.job, exp.launch
        nodes, procs = self.shape(exp)
        options = []
        if job.partition or launch.partition:
            options.append(f"--partition={job.partition or launch.partition}")
        if job.exclude:
            options.append(f"--exclude={','.join(job.exclude)}")
        if job.after:  # starts only when every listed job has finished successfully (profile -> search -> train)
            options.append("--dependency=afterok:" + ":".join(job.after))
        if job.array:
            indices = points if points is not None else list(range(len(exp.points)))
            options.append(f"--array={','.join(map(str, indices))}" + (f"%{job.max_parallel}" if job.max_parallel
                                                                        else ""))
        variables = [f"RESULTS={shlex.quote(str(self.results.resolve()))}", f"IMAGE={shlex.quote(job.image)}",
                     f"CONTAINER_RUNTIME={job.runtime}", f"MPI_LAUNCHER={job.mpi_launcher}"]
        variables += [f"CONTAINER_MOUNTS={shlex.quote(job.mounts)}"] if job.mounts else []
        variables += [f"SRUN_MPI={job.srun_mpi}"] if job.srun_mpi else []
        # No image: the ranks run this Python's environment, as a run here does.
        variables += [] if job.image else [f"VENV={shlex.quote(sys.prefix)}"]
        variables += [f"PROCS_PER_NODE={procs}", f"FORCE={int(self.force)}"]
        variables += [f"SETS=({' '.join(shlex.quote(s) for s in self.sets)})"] if self.sets else []
        exports = {"REPROFLOW_ATTEMPT": str(self.attempt), "REPROFLOW_RETRY_OF": self.retry_of,
                   **{name: os.environ.get(name, "") for name in _PASSED_ON}}
        variables += [f"export {name}={shlex.quote(shell_value(name, value))}" for name, value in exports.items()
                      if value]
        return render_job(JobScript(
            suite=self._visible(suite, write=write),
            experiments=(exp,),
            job_name=f"reproflow-{suite.name}-{exp.name}",
            nodes=nodes,
            tasks_per_node=procs,
            time_limit=job.time or format_slurm_time(slurm_seconds(launch.time_limit)),
            options=tuple(options),
            variables=tuple(variables),
            checkout=shlex.quote(str(self.root.resolve())),
            submitted=True,
        ), self.root)

    def _visible(self, suite: Suite, *, write: bool = True) -> Suite:
        """The suite as its jobs can read it: in an image, the checkout is the image's, so the file (a
        built-in suite's or one of the user's) is copied beside the job scripts, by content (not by a
        dry run)."""
        if not self.job.image:
            return suite
        text = suite.path.read_text()
        copy = self.folder(suite) / "suites" / hashlib.sha256(text.encode()).hexdigest()[:12] / suite.path.name
        if write and not copy.is_file():  # two submissions at once write the same bytes: whole files either way
            atomic_write(copy, text)
        return replace(suite, path=copy)

    def check(self, *, on_disk: bool = True) -> None:
        """Refuse, before anything is submitted, an image or a runtime the jobs could not start."""
        if not self.job.image:
            return
        problems = [image_problem(self.job.image, on_disk=on_disk)]
        if on_disk:
            problems += [f"{what} ({fix})" for what, fix in runtime_problems(self.job.runtime)]
        problems = [p for p in problems if p]
        if problems:
            raise ReproflowError("nothing was submitted: " + "; ".join(problems) + ".")

    def _sbatch(self, suite: Suite, path: Path) -> list[str]:
        """sbatch's arguments for the script at `path`: its log beside it, named by the job id."""
        log = self.folder(suite) / ("%A_%a.out" if self.job.array else "%j.out")
        return ["sbatch", "--parsable", f"--output={log}", str(path)]

    def dry_run(self, suite: Suite, exp: Experiment) -> str:
        """The sbatch command and the exact script it would submit, without submitting."""
        self.check(on_disk=False)
        text = self.script(suite, exp, write=False)
        path = self.folder(suite) / f"{exp.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.sbatch"
        return f"# {shlex.join(self._sbatch(suite, path))}\n{text}"

    def unmeasured(self, suite: Suite, exp: Experiment) -> list[int]:
        """The indices of the points that have no whole result file in any setting the job can resolve its
        launch to ('auto': CUDA with NCCL, or CPU with gloo); with `force`, all of them."""
        if self.force:
            return list(range(len(exp.points)))
        launch = exp.launch
        nodes, procs = self.shape(exp)
        settings = {(b, d) for b, d in (("nccl", "cuda"), ("gloo", "cpu"))
                    if launch.backend in ("auto", b) and launch.device in ("auto", d)}
        settings = settings or {(launch.backend, launch.device)}

        def done(point: Point) -> bool:
            paths = (point_path(self.results, suite.name, exp.name, point.key(nodes * procs, b, d, launch.repeats))
                     for b, d in settings)
            return any(path.is_file() and not point_file_problem(path) for path in paths)

        return [i for i, point in enumerate(exp.points) if not done(point)]

    def submit(self, suite: Suite, exp: Experiment) -> list[str]:
        """Submit one experiment (one array task per point still to measure with the job's `array`); return
        the Slurm job ids, none when every point is measured already (a rerun resumes where the last one
        stopped)."""
        todo = self.unmeasured(suite, exp)
        for i in sorted(set(range(len(exp.points))) - set(todo)):
            events.emit("point", experiment=exp.name, index=i + 1, total=len(exp.points),
                        label=exp.points[i].label, status=events.SKIPPED)
        if not todo:
            retry.say(f"reproflow: {suite.name} / {exp.name}: all {len(exp.points)} point(s) measured earlier; "
                      "nothing submitted (--force measures them again)")
            return []
        self.check()
        text = self.script(suite, exp, todo)
        # Named by content: a submission never rewrites a script another is about to submit.
        path = self.folder(suite) / f"{exp.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.sbatch"
        atomic_write(path, text, under=self.results)
        try:
            proc = subprocess.run(self._sbatch(suite, path), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise ReproflowError("cannot submit to Slurm: sbatch is not installed here. Is this a Slurm login "
                                 "node? Use `reproflow run` to run locally.") from None
        if proc.returncode != 0:
            raise ReproflowError(f"sbatch refused {path}: {proc.stderr.strip() or proc.stdout.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        ids = [f"{job_id}_{i}" for i in todo] if self.job.array else [job_id]
        events.emit("submitted", job_ids=ids)
        for one in ids:
            record_job(self.results, suite.name, exp.name, one, "submit", attempt=self.attempt,
                       retry_of=self.retry_of)
        return ids

    def submit_call(self, name: str, fn: Callable[..., Any], *args: Any, folder: Path, minutes: int) -> str:
        """Submit `fn(*args)` through submitit as one task on one node, in the job's image, partition and
        dependencies: a pipeline step that is not a suite, such as Aceso's search. Returns the Slurm job id;
        submitit's pickles and logs go to `folder`."""
        import submitit

        job = self.job
        if job.image and job.runtime == "oci":
            raise ReproflowError(f"{name} is a Python call, which runs through submitit: with --runtime oci Slurm "
                                 "starts the container only for a job script's steps. Use --runtime pyxis or "
                                 "apptainer for this pipeline, or no --image (the step needs Python only).")
        self.check()
        setup = [f"export {n}={shlex.quote(os.environ[n])}" for n in _PASSED_ON if os.environ.get(n)]
        srun_args = ["--export=ALL"]  # --export=NONE below: srun must ask for the job's environment
        python = shlex.quote(sys.executable)
        if job.image:
            setup.append(f"export REPROFLOW_IMAGE={shlex.quote(job.image)} REPROFLOW_CONTAINER_RUNTIME={job.runtime}")
            mounts = job.mounts or f"{self.results.resolve()}:{self.results.resolve()}"
            if job.runtime == "pyxis":
                srun_args += [f"--container-image={job.image}", f"--container-mounts={mounts}"]
                python = "python3"  # the image's, first on its PATH; this process's path need not exist there
            else:
                python = shlex.join(["apptainer", "exec", "--bind", mounts, job.image, "python3"])
        params: dict[str, Any] = {"job_name": f"reproflow-{name}", "nodes": 1, "ntasks_per_node": 1,
                                  "time": minutes, "setup": setup, "srun_args": srun_args,
                                  "additional_parameters": {"export": "NONE"}}
        if job.partition:
            params["partition"] = job.partition
        if job.exclude:
            params["exclude"] = ",".join(job.exclude)
        if job.after:
            params["dependency"] = "afterok:" + ":".join(job.after)
        try:
            executor = submitit.SlurmExecutor(folder=folder / "%j", python=python)
        except RuntimeError as exc:
            raise ReproflowError(f"cannot submit to Slurm: {exc}. Is this a Slurm login node? "
                                 "Use `reproflow run` to run locally.") from None
        executor.update_parameters(**params)
        return str(executor.submit(fn, *args).job_id)

    def supervise(self, suite: Suite, exp: Experiment, poll_s: float = 2.0) -> list[retry.Attempt]:
        """Submit, wait, classify each finished job; resubmit infrastructure failures (at most the job's
        `retries` times) without the nodes that failed. Experiment failures, time limits and cancellations
        end it."""
        nodes, procs = self.shape(exp)
        retries = self.job.retries
        current = replace(self, job=replace(self.job, nodes=nodes, procs_per_node=procs))
        attempts: list[retry.Attempt] = []
        limit = slurm_seconds(self.job.time or exp.launch.time_limit) + 300.0
        while True:
            ids = current.submit(suite, exp)
            if not ids:  # every point measured earlier
                return attempts
            job = current.job
            attempt = retry.Attempt(current.attempt, ids, *current.shape(exp), job.exclude)
            attempts.append(attempt)
            retry.say(f"reproflow: {suite.name} / {exp.name} attempt {attempt.number}: job(s) {', '.join(ids)} "
                      f"({attempt.nodes} node(s) x {attempt.procs} rank(s)"
                      + (f", excluding {','.join(job.exclude)})" if job.exclude else ")"))
            states = retry.wait_for(ids, retry.say, poll_s, limit)
            attempt.verdicts = retry.verdicts(states, self.folder(suite))
            for verdict in attempt.verdicts:
                retry.say(f"reproflow: {verdict.line()}")
            failed = [v for v in attempt.verdicts if v.category != retry.OK]
            infra = [v for v in failed if v.category == retry.INFRASTRUCTURE]
            if not failed:
                return attempts
            if not infra or len(infra) < len(failed):
                kinds = sorted({v.category for v in failed if v.category != retry.INFRASTRUCTURE})
                retry.say(f"reproflow: not retried: {', '.join(kinds) or 'infrastructure'} failures are not "
                          "retried (finished points are kept; fix the cause and submit again to resume)")
                return attempts
            if attempt.number > retries:
                retry.say(f"reproflow: infrastructure failure after {retries} retr{'y' if retries == 1 else 'ies'}; "
                          "giving up (finished points are kept)")
                return attempts
            exclude = tuple(sorted(set(job.exclude) | {n for v in infra for n in v.nodes}))
            states_now = retry.node_states(job.partition or exp.launch.partition)
            free = [n for n, st in states_now.items() if retry.usable(st) and n not in exclude]
            shape = retry.fit(nodes, procs, len(free))
            if shape is None:
                retry.say(f"reproflow: cannot retry: no usable node left outside {','.join(exclude) or 'none'}")
                return attempts
            if shape != (nodes, procs):
                retry.say(f"reproflow: only {len(free)} usable node(s) left: the retry runs the same "
                          f"{nodes * procs} ranks as {shape[0]} node(s) x {shape[1]} (was {nodes} x {procs})")
            current = replace(current, job=replace(job, nodes=shape[0], procs_per_node=shape[1], exclude=exclude,
                                                   array=False),
                              attempt=attempt.number + 1, retry_of=infra[0].job_id)


def record_job(results: Path, suite: str, experiment: str, job_id: str, via: str, **extra: object) -> None:
    """Append a submitted job to `<results>/<suite>/jobs.jsonl` (read by `reproflow status`)."""
    append_line(results / suite / "jobs.jsonl", json.dumps({
        "job_id": job_id, "suite": suite, "experiment": experiment, "via": via, **extra,
        "submitted": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}), under=results)
