"""Slurm executor through submitit: one job per experiment, one submitit task per rank.

Each task turns submitit's JobEnvironment into the torch.distributed environment and runs the
same worker as every other executor. With an image, each task starts in it through Pyxis (srun
--container-image) or Apptainer (`apptainer exec` before the task's Python), so the image must hold
Python, submitit and reproflow (the images in containers/ do). Slurm's OCI support runs one task per
node, and submitit one task per rank: OCI jobs go through the sbatch scripts (CONTAINER_RUNTIME=oci).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reproflow.launch import retry
from reproflow.launch.containers import image_problem, image_variable, runtime_problems
from reproflow.launch.local import worker_args
from reproflow.launch.render import shell_value
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import JOB_ID_RE, PARTITION_RE, Experiment, Point, Suite, slurm_seconds
from reproflow.store import events
from reproflow.store.files import append_line, atomic_write
from reproflow.store.results import point_file_problem, point_path
from reproflow.store.runs import RUN_ID_ENV

NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a host name, as Slurm's NodeName is


def rendezvous_port(job_id: str) -> int:
    """A port every task of a job derives alike from the job id (20000-29999, as the sbatch template's)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    # Below Linux's ephemeral ports (32768 and up by default): a port there may be held by any outgoing
    # connection on the node, and the rendezvous then fails to listen (EADDRINUSE), as one of twenty
    # array tasks did on port 36814.
    return 20000 + int(digits) % 10000


def run_rank(worker_argv: list[str]) -> int:
    """Body of one submitit task: set the rank environment, run the worker, fail loudly."""
    import submitit

    from reproflow.rank import worker

    env = submitit.JobEnvironment()
    os.environ.update(
        RANK=str(env.global_rank),
        WORLD_SIZE=str(env.num_tasks),
        LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.num_tasks // env.num_nodes),
        MASTER_ADDR=env.hostnames[0],
        MASTER_PORT=os.environ.get("MASTER_PORT") or str(rendezvous_port(env.job_id)),
    )
    code = worker.main(worker_argv)
    if code != 0:
        raise RuntimeError(f"rank {env.global_rank}: reproflow worker exited with {code}")
    # Once submitit has written this task's result and returns, the process leaves as a local rank does
    # (worker.leave): the interpreter's teardown aborted a finished spatial rank on the test cluster, and
    # Slurm failed its job with every row written. Registered last, so run first of the exit handlers.
    atexit.register(worker.leave, 0)
    return code


@dataclass
class SubmititExecutor:
    """Submit experiments to Slurm with submitit (`reproflow submit`)."""

    results: Path
    root: Path
    nodes: int | None = None
    procs: int | None = None
    partition: str | None = None
    image: str = ""
    container_mounts: str = ""
    runtime: str = "pyxis"
    force: bool = False
    sets: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    array: bool = False
    max_parallel: int = 0
    python: str = ""
    # Set on retries: which attempt this is, the job it retries, and the nodes to keep out.
    attempt: int = 1
    retry_of: str = ""
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Checked before anything reaches a job script, where a newline would end the #SBATCH lines.
        for option, text in (("--results", str(self.results)), ("--image", self.image),
                             ("--mounts", self.container_mounts), ("python", self.python)):
            shell_value(option, text)
        for name in ("nodes", "procs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ReproflowError(f"{name} {value!r}: give a whole number >= 1, or leave it out for the "
                                     "suite's launch.")
        for node in self.exclude:
            if not NODE_RE.fullmatch(node):
                raise ReproflowError(f"--exclude {node[:40]!r} is not a node name: give Slurm's node names, "
                                     "comma-separated (node7,node12), or @FILE holding them (reproflow nodes writes "
                                     "exclude.txt).")
        for job in self.after:
            if not JOB_ID_RE.fullmatch(job):
                raise ReproflowError(f"--after {job[:40]!r} is not a Slurm job id. Give the ids sbatch or "
                                     "`reproflow submit` printed (e.g. --after 1234 or --after 1234,1235).")

    def folder(self, suite: Suite) -> Path:
        """Where submitit keeps pickles and logs of this suite's jobs."""
        return (self.results / suite.name / "submitit").resolve()

    def parameters(self, suite: Suite, exp: Experiment) -> dict[str, Any]:
        """submitit SlurmExecutor parameters for one experiment."""
        launch = exp.launch
        params = self._job(f"reproflow-{suite.name}-{exp.name}", self.nodes or launch.nodes,
                           self.procs or launch.procs_per_node, max(1, slurm_seconds(launch.time_limit) // 60),
                           self.partition or launch.partition)
        if launch.launcher == "mpi":
            # One MPI world from srun's tasks: SRUN_MPI, else the plugin the image's MPI needs (pmi2 for the
            # CPU image's MPICH, pmix for the gpu image's Open MPI), else pmix, as the sbatch template
            # chooses; without it every task is an MPI world of its own.
            plugin = os.environ.get("SRUN_MPI") or image_variable(self.image, "REPROFLOW_SRUN_MPI") or "pmix"
            params["srun_args"] = [*params["srun_args"], f"--mpi={plugin}"]
        if launch.gpus_per_node:
            params["gpus_per_node"] = launch.gpus_per_node
        if launch.exclusive:
            params["exclusive"] = True
        if self.array and self.max_parallel:
            params["array_parallelism"] = self.max_parallel
        return params

    def _job(self, name: str, nodes: int, tasks_per_node: int, minutes: int, partition: str) -> dict[str, Any]:
        """The parameters every job shares: environment, image, excluded nodes, partition, dependencies."""
        if partition and not PARTITION_RE.fullmatch(partition):
            raise ReproflowError(f"--partition {partition!r} is not a Slurm partition name: use letters, digits, "
                                 "'_', '.', '-' (several separated by commas).")
        # --export=NONE keeps the submitting shell's variables (tokens, AMI settings) out of the job;
        # srun inside must then ask for the job's environment explicitly.
        srun_args: list[str] = ["--export=ALL"]
        setup = [f"export REPROFLOW_ATTEMPT={self.attempt}"]
        if os.environ.get(RUN_ID_ENV):  # the rows join the run that submitted them
            setup.append(f"export {RUN_ID_ENV}={shlex.quote(os.environ[RUN_ID_ENV])}")
        if os.environ.get("REPROFLOW_INJECT_FAULT"):  # the test hook crosses --export=NONE on purpose
            setup.append(f"export REPROFLOW_INJECT_FAULT={shlex.quote(os.environ['REPROFLOW_INJECT_FAULT'])}")
        if self.retry_of:
            setup.append(f"export REPROFLOW_RETRY_OF={shlex.quote(self.retry_of)}")
        if self.image:
            image = shell_value("--image", self.image)
            setup.append(f"export REPROFLOW_IMAGE={shlex.quote(image)} REPROFLOW_CONTAINER_RUNTIME={self.runtime}")
            if self.runtime == "pyxis":
                srun_args += [f"--container-image={image}", f"--container-mounts={self._mounts()}"]
        params: dict[str, Any] = {
            "job_name": name,
            "nodes": nodes,
            "ntasks_per_node": tasks_per_node,
            "time": minutes,
            "setup": setup,
            "srun_args": srun_args,
            "additional_parameters": {"export": "NONE"},
        }
        if self.exclude:
            params["exclude"] = ",".join(self.exclude)
        if partition:
            params["partition"] = partition
        if self.after:
            # Starts only when every listed job has finished successfully (profile -> search -> train).
            params["dependency"] = "afterok:" + ":".join(self.after)
        return params

    def _mounts(self) -> str:
        results = self.results.resolve()
        return shell_value("--mounts", self.container_mounts) or f"{results}:{results}"

    def _visible(self, suite: Suite) -> Suite:
        """The suite as its tasks can read it: in an image, only the results folder is mounted, so the
        file (a built-in suite's or one of the user's) is copied beside the jobs' pickles, by content."""
        if not self.image:
            return suite
        text = suite.path.read_text()
        copy = self.folder(suite) / "suites" / hashlib.sha256(text.encode()).hexdigest()[:12] / suite.path.name
        if not copy.is_file():  # two submissions at once write the same bytes: whole files either way
            atomic_write(copy, text)
        return replace(suite, path=copy)

    def _python(self) -> str:
        """The tasks' Python as a shell command (submitit writes it into the job script as it is): with an
        image, the image's (inside Apptainer, or as Pyxis starts the task in it: the first python3 on the
        job's PATH, which the images' virtual environment leads); else this one."""
        if self.image and self.runtime == "apptainer":
            return shlex.join(["apptainer", "exec", "--bind", self._mounts(), self.image, "python3"])
        if self.image and self.runtime == "pyxis":
            return shlex.quote(self.python or "python3")  # this process's path need not exist in the image
        return shlex.quote(self.python or sys.executable)

    def check(self, *, on_disk: bool = True) -> None:
        """Refuse, before anything is submitted, an image or a runtime the jobs could not start."""
        if not self.image:
            return
        if self.runtime == "oci":
            raise ReproflowError("--runtime oci: Slurm's OCI support runs one task per node, and `reproflow "
                                 "submit` starts one task per rank. Submit the suite's sbatch script instead: "
                                 "sbatch --export=NONE,IMAGE=<squash file>,CONTAINER_RUNTIME=oci sbatch/<suite>."
                                 "sbatch, or use --runtime pyxis / apptainer.")
        problems = [image_problem(self.image, on_disk=on_disk)]
        if on_disk:
            problems += [f"{what} ({fix})" for what, fix in runtime_problems(self.runtime)]
        problems = [p for p in problems if p]
        if problems:
            raise ReproflowError("nothing was submitted: " + "; ".join(problems) + ".")

    def dry_run(self, suite: Suite, exp: Experiment) -> str:
        """The sbatch text submitit would submit, without submitting."""
        from submitit.slurm import slurm

        self.check(on_disk=False)
        folder = self.folder(suite)
        command = f"{self._python()} -u -m submitit.core._submit {shlex.quote(str(folder / '%j'))}"
        params = self.parameters(suite, exp)
        if self.array:
            params["map_count"] = len(exp.points)
        return slurm._make_sbatch_string(command=command, folder=folder / "%j", **params)

    def unmeasured(self, suite: Suite, exp: Experiment) -> list[int]:
        """The indices of the points that have no whole result file in any setting the job can resolve its
        launch to ('auto': CUDA with NCCL, or CPU with gloo); with `force`, all of them."""
        if self.force:
            return list(range(len(exp.points)))
        launch = exp.launch
        world = (self.nodes or launch.nodes) * (self.procs or launch.procs_per_node)
        settings = {(b, d) for b, d in (("nccl", "cuda"), ("gloo", "cpu"))
                    if launch.backend in ("auto", b) and launch.device in ("auto", d)}
        settings = settings or {(launch.backend, launch.device)}

        def done(point: Point) -> bool:
            paths = (point_path(self.results, suite.name, exp.name, point.key(world, b, d, launch.repeats))
                     for b, d in settings)
            return any(path.is_file() and not point_file_problem(path) for path in paths)

        return [i for i, point in enumerate(exp.points) if not done(point)]

    def submit(self, suite: Suite, exp: Experiment) -> list[str]:
        """Submit one experiment (one array task per point with `array`); return the Slurm job ids, none
        when every point is measured already (a rerun resumes where the last one stopped)."""
        todo = self.unmeasured(suite, exp)
        for i in sorted(set(range(len(exp.points))) - set(todo)):
            events.emit("point", experiment=exp.name, index=i + 1, total=len(exp.points),
                        label=exp.points[i].label, status=events.SKIPPED)
        if not todo:
            retry.say(f"reproflow: {suite.name} / {exp.name}: all {len(exp.points)} point(s) measured earlier; "
                      "nothing submitted (--force measures them again)")
            return []
        executor = self._executor(self.folder(suite), self.parameters(suite, exp))
        argv = worker_args(self._visible(suite), exp, self.results.resolve(), self.force, self.root, self.sets)
        if self.array:
            jobs = executor.map_array(run_rank, [[*argv, "--point", str(i)] for i in todo])
        else:
            jobs = [executor.submit(run_rank, argv)]
        ids = [str(job.job_id) for job in jobs]
        events.emit("submitted", job_ids=ids)
        for job_id in ids:
            record_job(self.results, suite.name, exp.name, job_id, "submitit", attempt=self.attempt,
                       retry_of=self.retry_of)
        return ids

    def submit_call(self, name: str, fn: Callable[..., Any], *args: Any, folder: Path, minutes: int) -> str:
        """Submit `fn(*args)` as one task on one node, as the experiments are submitted (environment,
        image, partition, `after`): a pipeline step that is not a suite, such as Aceso's search.
        Returns the Slurm job id; submitit's pickles and logs go to `folder`."""
        executor = self._executor(folder, self._job(f"reproflow-{name}", 1, 1, minutes, self.partition or ""))
        return str(executor.submit(fn, *args).job_id)

    def _executor(self, folder: Path, params: dict[str, Any]) -> Any:
        """A submitit SlurmExecutor with `params`, after the image and runtime checks."""
        import submitit

        self.check()
        try:
            executor = submitit.SlurmExecutor(folder=folder / "%j", python=self._python())
        except RuntimeError as exc:
            raise ReproflowError(f"cannot submit to Slurm: {exc}. Is this a Slurm login node? "
                                 "Use `reproflow run` to run locally.") from None
        executor.update_parameters(**params)
        return executor

    def supervise(self, suite: Suite, exp: Experiment, retries: int, poll_s: float = 2.0) -> list[retry.Attempt]:
        """Submit, wait, classify each finished job; resubmit infrastructure failures (at most `retries`
        times) without the nodes that failed. Experiment failures, time limits and cancellations end it."""
        nodes, procs = self.nodes or exp.launch.nodes, self.procs or exp.launch.procs_per_node
        current = replace(self, nodes=nodes, procs=procs)
        attempts: list[retry.Attempt] = []
        limit = slurm_seconds(exp.launch.time_limit) + 300.0
        while True:
            ids = current.submit(suite, exp)
            if not ids:  # every point measured earlier
                return attempts
            attempt = retry.Attempt(current.attempt, ids, current.nodes or nodes, current.procs or procs,
                                    current.exclude)
            attempts.append(attempt)
            retry.say(f"reproflow: {suite.name} / {exp.name} attempt {attempt.number}: job(s) {', '.join(ids)} "
                      f"({attempt.nodes} node(s) x {attempt.procs} rank(s)"
                      + (f", excluding {','.join(current.exclude)})" if current.exclude else ")"))
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
            exclude = tuple(sorted(set(current.exclude) | {n for v in infra for n in v.nodes}))
            states_now = retry.node_states(current.partition or exp.launch.partition)
            free = [n for n, st in states_now.items() if retry.usable(st) and n not in exclude]
            shape = retry.fit(nodes, procs, len(free))
            if shape is None:
                retry.say(f"reproflow: cannot retry: no usable node left outside {','.join(exclude) or 'none'}")
                return attempts
            if shape != (nodes, procs):
                retry.say(f"reproflow: only {len(free)} usable node(s) left: the retry runs the same "
                          f"{nodes * procs} ranks as {shape[0]} node(s) x {shape[1]} (was {nodes} x {procs})")
            current = replace(current, nodes=shape[0], procs=shape[1], attempt=attempt.number + 1,
                              retry_of=infra[0].job_id, exclude=exclude, array=False)


def record_job(results: Path, suite: str, experiment: str, job_id: str, via: str, **extra: object) -> None:
    """Append a submitted job to `<results>/<suite>/jobs.jsonl` (read by `reproflow status`)."""
    append_line(results / suite / "jobs.jsonl", json.dumps({
        "job_id": job_id, "suite": suite, "experiment": experiment, "via": via, **extra,
        "submitted": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}), under=results)
