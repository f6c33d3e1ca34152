"""`reproflow doctor`: check a cluster before anything is submitted, and say how to fix what is missing.

Checks: Slurm client tools, controller and nodes, accounting (sacct); with an image, the container
runtime the jobs will use (Pyxis with enroot, Slurm's OCI support, or Apptainer) and
that the image is a squash file given by a path; that the results folder is on a filesystem every node
sees, GPUs per node, and MPI (srun's plugins, mpi4py's library). Each check prints ok, warn or FAIL
with the fix.
"""

from __future__ import annotations

import re
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reproflow.launch.containers import image_problem, image_skipped, oci_conf, runtime_problems
from reproflow.launch.shell import run

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Check:
    """One finding: status, what was found, and the fix when it is not ok."""

    status: str
    what: str
    fix: str = ""

    def line(self) -> str:
        """The finding as printed."""
        text = f"[{self.status:>4}] {self.what}"
        return text + (f"\n       fix: {self.fix}" if self.fix else "")


def check_tools() -> list[Check]:
    """sbatch, srun, sacct and scontrol on PATH."""
    missing = [t for t in ("sbatch", "srun", "sacct", "scontrol") if shutil.which(t) is None]
    if missing:
        return [Check(FAIL, f"Slurm commands not found: {', '.join(missing)}",
                      "run on the cluster's login/head node, or install the Slurm client (Debian: slurm-client); "
                      "without Slurm use `reproflow run` to run here")]
    return [Check(OK, "Slurm commands found: sbatch, srun, sacct, scontrol")]


def check_cluster() -> list[Check]:
    """Controller answers, nodes are usable, accounting records jobs."""
    ping = run(["scontrol", "ping"])
    if ping is None or ping.returncode != 0 or "UP" not in ping.stdout:
        return [Check(FAIL, "Slurm controller does not answer `scontrol ping`",
                      "start slurmctld (and munge), or check SlurmctldHost in slurm.conf")]
    out = run(["sinfo", "-h", "-N", "-o", "%N %T"])
    states: dict[str, str] = {}
    for line in (out.stdout if out else "").splitlines():
        if line.strip():
            node, state = line.split()[:2]
            states[node] = state
    usable = [n for n, s in states.items() if s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")]
    checks = []
    if usable:
        checks.append(Check(OK, f"Slurm is ready: controller up, {len(usable)} of {len(states)} node(s) usable "
                                f"({', '.join(f'{n}={states[n]}' for n in sorted(states))})"))
    else:
        checks.append(Check(FAIL, f"no usable nodes ({states or 'none'})",
                            "resume them (`scontrol update nodename=<n> state=resume`) or check slurmd"))
    acct = run(["sacct", "-X", "-n", "-S", "now-1hours", "-o", "JobID"])
    if acct is None or acct.returncode != 0 or "disabled" in (acct.stdout + acct.stderr):
        checks.append(Check(WARN, "accounting is off: sacct cannot report job states (COMPLETED, FAILED, ...)",
                            "configure slurmdbd (AccountingStorageType=accounting_storage/slurmdbd)"))
    else:
        checks.append(Check(OK, "accounting on: sacct reports job states"))
    return checks


def check_containers(runtime: str) -> list[Check]:
    """What the container runtime the jobs will use needs here (Pyxis, Slurm's OCI support, Apptainer)."""
    problems = runtime_problems(runtime)
    if problems:
        return [Check(FAIL, what, fix) for what, fix in problems]
    return [Check(OK, f"container runtime {runtime} ready: " + {
        "pyxis": "srun knows --container-image, enroot and unsquashfs found",
        "oci": f"{oci_conf()} names an installed runtime, unsquashfs found",
        "apptainer": "apptainer found"}[runtime])]


def check_image(image: str) -> list[Check]:
    """The image is a squash file given by a path Pyxis reads as a file."""
    if not image:
        return []
    problem = image_problem(image)
    if problem:
        what, _, fix = problem.partition(": ")
        return [Check(FAIL, what, fix)]
    # A part left out at build time (the EFA installer where it cannot be downloaded) is missed on the nodes.
    return [Check(OK, f"image {image} is a squash file")] + [
        Check(WARN, f"image {image} was built without {part}: {why}",
              "rebuild it with `make containers` on a build host that can fetch it before running on nodes that "
              "need it")
        for part, why in sorted(image_skipped(image).items())]


def check_shared_results(results: Path, nodes: int) -> list[Check]:
    """Write a token on this host and read it back on `nodes` nodes through srun."""
    results.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    marker = results.resolve() / f".doctor-{token}"
    marker.write_text(token + "\n")
    try:
        out = run(["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--time=2",
                    "cat", str(marker)], timeout=120)
    finally:
        marker.unlink(missing_ok=True)
    if out is None or out.returncode != 0:
        detail = (out.stderr.strip().splitlines() or ["no output"])[-1] if out else "srun did not run"
        return [Check(WARN, f"could not check that {results} is shared: srun on {nodes} node(s) failed ({detail})",
                      "make sure nodes are free, or check by hand that every node mounts the results folder")]
    seen = out.stdout.split()
    if seen.count(token) == nodes:
        return [Check(OK, f"results folder {results.resolve()} is visible from {nodes} node(s)")]
    return [Check(FAIL, f"results folder {results.resolve()} is not visible from every node",
                  "put --results / RESULTS on a shared filesystem (FSx for Lustre, EFS, NFS /home)")]


def check_gpus() -> list[Check]:
    """GPUs per node from Slurm's GRES."""
    out = run(["sinfo", "-h", "-N", "-o", "%N %G"])
    if out is None or out.returncode != 0:
        return []
    gpus = {}
    for line in out.stdout.splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2:
            found = re.findall(r"gpu(?::[\w-]+)?:(\d+)", parts[1])
            gpus[parts[0]] = sum(int(n) for n in found)
    if not gpus or not any(gpus.values()):
        return [Check(WARN, "no GPUs in Slurm's GRES: GPU suites will be refused or run on CPU with gloo",
                      "declare GPUs in gres.conf and slurm.conf (Gres=gpu:N), or use CPU suites")]
    counts = sorted(set(gpus.values()))
    return [Check(OK, f"GPUs per node: {', '.join(f'{n}={c}' for n, c in sorted(gpus.items()))}"
                      + ("" if len(counts) == 1 else " (nodes differ)"))]


def check_mpi() -> list[Check]:
    """srun's MPI plugins and the MPI library mpi4py loads (suites with launch.launcher = 'mpi')."""
    out = run(["srun", "--mpi=list"])
    plugins = sorted(set(re.findall(r"\b(pmix|pmi2)\b", (out.stdout + out.stderr) if out else "")))
    probe = run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"])
    library = probe.stdout.strip() if probe is not None and probe.returncode == 0 else ""
    checks = [Check(OK, f"srun MPI plugins: {', '.join(plugins)} (SRUN_MPI picks one; pmix is the default)")
              if plugins else Check(WARN, "srun offers neither pmix nor pmi2: MPI suites cannot start through srun",
                                    "install Slurm's PMIx plugin (Debian: libpmix-dev), or MPI_LAUNCHER=mpirun_rsh")]
    checks.append(Check(OK, f"mpi4py loads {library}") if library else
                  Check(WARN, "mpi4py is not importable: spatial-parallelism suites with the mpi backend will fail",
                        "pip install '.[mpi]', or build mpi4py against the cluster's MPI (the spatial image does)"))
    return checks


def diagnose(image: str, results: Path, nodes: int, runtime: str = "pyxis") -> list[Check]:
    """Every check, in the order a user would fix things."""
    checks = check_tools()
    slurm_ok = checks[0].status == OK
    if slurm_ok:
        checks += check_cluster()
    if image:
        checks += check_containers(runtime) + check_image(image)
    if slurm_ok and all(c.status != FAIL for c in checks[:3]):
        checks += check_shared_results(results, nodes) + check_gpus() + check_mpi()
    return checks


def doctor(image: str, results: Path, nodes: int, runtime: str = "pyxis",
           out: Callable[[str], None] = print) -> int:
    """Every check's line through `out`; returns how many must be fixed before submitting."""
    checks = diagnose(image, results, nodes, runtime)
    for check in checks:
        out(check.line())
    return sum(c.status == FAIL for c in checks)
