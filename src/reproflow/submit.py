"""Slurm executor through submitit: one job per experiment, one submitit task per rank.

Each task turns submitit's JobEnvironment into the torch.distributed environment and runs the
same worker as every other executor. With an image, srun gets Pyxis' --container-image, so the
image must hold Python, submitit and reproflow (the images in containers/ do).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproflow.errors import ReproflowError
from reproflow.local import worker_args
from reproflow.results import atomic_write
from reproflow.suite import Experiment, Suite, slurm_seconds


def rendezvous_port(job_id: str) -> int:
    """A port every task of a job derives alike from the job id (20000-39999)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return 20000 + int(digits) % 20000


def run_rank(worker_argv: list[str]) -> int:
    """Body of one submitit task: set the rank environment, run the worker, fail loudly."""
    import submitit

    from reproflow import worker

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
    force: bool = False
    sets: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    array: bool = False
    max_parallel: int = 0
    python: str = ""

    def folder(self, suite: Suite) -> Path:
        """Where submitit keeps pickles and logs of this suite's jobs."""
        return (self.results / suite.name / "submitit").resolve()

    def parameters(self, suite: Suite, exp: Experiment) -> dict[str, Any]:
        """submitit SlurmExecutor parameters for one experiment."""
        launch = exp.launch
        srun_args: list[str] = []
        setup = [f"export REPROFLOW_IMAGE={self.image}"] if self.image else []
        if self.image:
            mounts = self.container_mounts or f"{self.results.resolve()}:{self.results.resolve()}"
            srun_args += [f"--container-image={self.image}", f"--container-mounts={mounts}"]
        params: dict[str, Any] = {
            "job_name": f"reproflow-{suite.name}-{exp.name}",
            "nodes": self.nodes or launch.nodes,
            "ntasks_per_node": self.procs or launch.procs_per_node,
            "time": max(1, slurm_seconds(launch.time_limit) // 60),
            "setup": setup,
            "srun_args": srun_args,
        }
        if launch.gpus_per_node:
            params["gpus_per_node"] = launch.gpus_per_node
        if self.partition or launch.partition:
            params["partition"] = self.partition or launch.partition
        if launch.exclusive:
            params["exclusive"] = True
        if self.after:
            # Starts only when every listed job has finished successfully (profile -> search -> train).
            params["dependency"] = "afterok:" + ":".join(self.after)
        if self.array and self.max_parallel:
            params["array_parallelism"] = self.max_parallel
        return params

    def _python(self) -> str:
        return self.python or sys.executable

    def dry_run(self, suite: Suite, exp: Experiment) -> str:
        """The sbatch text submitit would submit, without submitting."""
        from submitit.slurm import slurm

        folder = self.folder(suite)
        command = f"{self._python()} -u -m submitit.core._submit {folder}/%j"
        params = self.parameters(suite, exp)
        if self.array:
            params["map_count"] = len(exp.points)
        return slurm._make_sbatch_string(command=command, folder=folder / "%j", **params)

    def submit(self, suite: Suite, exp: Experiment) -> list[str]:
        """Submit one experiment (one array task per point with `array`); return the Slurm job ids."""
        import submitit

        try:
            executor = submitit.SlurmExecutor(folder=self.folder(suite) / "%j", python=self._python())
        except RuntimeError as exc:
            raise ReproflowError(f"cannot submit to Slurm: {exc}. Is this a Slurm login node? "
                                 "Use `reproflow run` to run locally.") from None
        executor.update_parameters(**self.parameters(suite, exp))
        argv = worker_args(suite, exp, self.results.resolve(), self.force, self.root, self.sets)
        if self.array:
            jobs = executor.map_array(run_rank, [[*argv, "--point", str(i)] for i in range(len(exp.points))])
        else:
            jobs = [executor.submit(run_rank, argv)]
        ids = [str(job.job_id) for job in jobs]
        for job_id in ids:
            record_job(self.results, suite.name, exp.name, job_id, "submitit")
        return ids


def record_job(results: Path, suite: str, experiment: str, job_id: str, via: str) -> None:
    """Append a submitted job to `<results>/<suite>/jobs.jsonl` (read by `reproflow status`)."""
    path = results / suite / "jobs.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    lines.append(json.dumps({"job_id": job_id, "suite": suite, "experiment": experiment, "via": via,
                             "submitted": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}))
    atomic_write(path, "\n".join(lines) + "\n")
