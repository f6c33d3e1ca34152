"""The job script of each container runtime and MPI launcher, reviewed as golden files.

Each case renders the script `reproflow submit` writes for one experiment and runs it under bash with
Slurm's and the runtimes' commands recorded instead of run (srun, scontrol, unsquashfs, mpirun_rsh);
the script and the commands it runs, paths made neutral, are compared with tests/golden/<case>.txt.
A change to the job (templates/job.sh, the template, the Job's rendering) shows as the diff of these
files: REPROFLOW_GOLDEN=write rewrites them. The same jobs run for real on the test cluster
(test_slurm.py, test_containers.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from reproflow.api import options
from reproflow.app.cli import build_parser
from reproflow.launch.containers import RUNTIMES
from reproflow.launch.job import MPI_LAUNCHERS, Job
from reproflow.launch.render import render_sbatch
from reproflow.launch.submit import SlurmExecutor
from reproflow.spec.errors import ReproflowError
from reproflow.spec.suite import load_suite

GOLDEN = Path(__file__).parent / "golden"

# Slurm's and the runtimes' commands, recorded (NUL-separated words, END after each command).
STUBS = r"""
record() { local a; { for a in "$@"; do printf '%s\0' "$a"; done; printf 'END\0'; } >> "$ARGV_OUT"; }
srun() {
    case " $* " in *" --help "*) echo "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH"; return ;; esac
    record srun "$@"
    case "$*" in *"enroot version"*) printf 'node1 4.1.2\nnode2 4.1.2\n' ;; esac
}
scontrol() {
    if [ "$1 $2" = "show job" ]; then echo "   Command=${ORIGINAL:-}"; else printf 'node1\nnode2\n'; fi
}
unsquashfs() {
    record unsquashfs "$@"
    if [ "$1" = -cat ]; then echo REPROFLOW_SRUN_MPI=pmi2; else mkdir -p "$4/etc"; fi
}
apptainer() { record apptainer "$@"; }
mpirun_rsh() { record mpirun_rsh "$@"; }
"""

IMAGE = "reproflow-cpu.sqsh"  # a stand-in squash file: squashfs' magic and a header length it holds
CASES = {
    "no-image-torchrun": ("param-demo", "comms", {}),
    "pyxis-torchrun": ("param-demo", "comms", {"image": IMAGE}),
    "oci-torchrun": ("param-demo", "comms", {"image": IMAGE, "runtime": "oci"}),
    "apptainer-torchrun": ("param-demo", "comms", {"image": IMAGE, "runtime": "apptainer"}),
    "array-torchrun": ("param-demo", "comms", {"array": True, "max_parallel": 2, "nodes": 2,
                                               "procs_per_node": 1, "exclude": ("node7",), "after": ("41",)}),
    "pyxis-mpi-srun": ("spatial-small", "check-resnet", {"image": IMAGE}),
    "oci-mpi-hydra": ("spatial-small", "check-resnet", {"image": IMAGE, "runtime": "oci"}),
    "no-image-mpi-mpirun_rsh": ("spatial-small", "check-resnet", {"mpi_launcher": "mpirun_rsh"}),
    "no-image-mpi-srun-pmi2": ("spatial-small", "check-resnet", {"mpi_launcher": "srun", "srun_mpi": "pmi2"}),
}


def fake_image(path: Path) -> None:
    data = bytearray(4096)
    data[:4] = b"hsqs"
    data[40:48] = (4096).to_bytes(8, "little")
    path.write_bytes(bytes(data))


def run_job(text: str, tmp: Path, env: dict[str, str] | None = None) -> list[list[str]]:
    """Run a job script under bash with the stubs; every recorded command's words."""
    (tmp / "stubs.sh").write_text(STUBS)
    (tmp / "slurm").mkdir(exist_ok=True)
    (tmp / "slurm" / "oci.conf").write_text('RunTimeRun="runc run %b"\n')
    argv = tmp / "argv"
    script = tmp / "job.sbatch"
    script.write_text(text)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, cwd=tmp, env={
        "PATH": "/usr/bin:/bin", "BASH_ENV": str(tmp / "stubs.sh"), "ARGV_OUT": str(argv), "HOME": str(tmp),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_SUBMIT_DIR": str(tmp), "SLURM_CONF": str(tmp / "slurm" / "slurm.conf"), **(env or {})})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    calls: list[list[str]] = [[]]
    for word in argv.read_bytes().decode().split("\0")[:-1] if argv.exists() else []:
        calls.append([]) if word == "END" else calls[-1].append(word)
    return calls[:-1]


def neutral(text: str, tmp: Path) -> str:
    """Paths of this machine made neutral, so that a golden file holds on any."""
    for path, name in ((tmp.resolve(), "<tmp>"), (ROOT.resolve(), "<checkout>"), (Path(sys.prefix), "<venv>")):
        text = text.replace(str(path), name)
    return re.sub(r"/suites/[0-9a-f]{12}/", "/suites/<sha256>/", text)  # the suite copy's: its content's


def check_golden(case: str, text: str) -> None:
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("REPROFLOW_GOLDEN") == "write":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} is missing: REPROFLOW_GOLDEN=write pytest tests/test_jobs.py writes it"
    if path.read_text() != text:
        pytest.fail(f"the job of {case} differs from {path}; if the change is intended, rewrite it with "
                    "REPROFLOW_GOLDEN=write pytest tests/test_jobs.py and review the diff")


def commands(calls: list[list[str]]) -> str:
    import shlex

    return "".join(shlex.join(c) + "\n" for c in calls)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_job_of_each_runtime_and_launcher_is_its_golden_file(case: str, tmp_path: Path) -> None:
    name, experiment, options = CASES[case]
    fake_image(tmp_path / IMAGE)
    if "image" in options:
        options = {**options, "image": str(tmp_path / IMAGE)}
    suite = load_suite(ROOT / "workflows" / f"{name}.toml")
    (exp,) = suite.select([experiment])
    executor = SlurmExecutor(results=tmp_path / "results", root=ROOT, job=Job(**options), sets=("iters=2",))
    text = executor.script(suite, exp, [0, 2] if options.get("array") else None)
    calls = run_job(text, tmp_path, {"SLURM_ARRAY_TASK_ID": "2"} if options.get("array") else None)
    assert calls, "the job ran nothing"
    check_golden(case, neutral(f"{text}\n# ---- the commands the job runs:\n{commands(calls)}", tmp_path))


def test_a_committed_script_runs_the_same_job_as_a_submitted_one(tmp_path: Path) -> None:
    """sbatch/<suite>.sbatch and `reproflow submit` run one templates/job.sh: given the same image and
    ranks, their steps are the same commands. The committed script finds the checkout it is in from the
    path Slurm records, submitted from another folder."""
    fake_image(tmp_path / IMAGE)
    suite = load_suite(ROOT / "workflows" / "param-demo.toml")
    committed = run_job(render_sbatch(suite, ROOT), tmp_path, {
        "IMAGE": str(tmp_path / IMAGE), "RESULTS": str(tmp_path / "results"), "SET": "iters=2",
        "ORIGINAL": str(ROOT / "sbatch" / "param-demo.sbatch")})
    (tmp_path / "argv").unlink()
    executor = SlurmExecutor(results=tmp_path / "results", root=ROOT, job=Job(image=str(tmp_path / IMAGE)),
                             sets=("iters=2",))
    submitted = run_job(executor.script(suite, suite.experiments[0]), tmp_path)
    # The submitted job reads its copy of the suite (the image holds its own checkout); else the same.
    copy = str(executor._visible(suite).path)
    assert [[w.replace(copy, "<suite>") for w in c] for c in submitted] == [
        [w.replace("/opt/reproflow/workflows/param-demo.toml", "<suite>") for w in c] for c in committed[:3]]


def test_the_rendezvous_port_is_one_per_job_below_the_ephemeral_ports(tmp_path: Path) -> None:
    """The port rule (templates/job.sh, the one place it is written): every job derives one from its id,
    never in the range the kernel hands to outgoing connections (where a port may be taken: EADDRINUSE),
    and neighbouring jobs differ."""
    ports = set()
    for job in [*range(168, 188), 99999, 1234567]:
        suite = load_suite(ROOT / "workflows" / "param-demo.toml")
        text = SlurmExecutor(results=tmp_path / "results", root=ROOT).script(suite, suite.experiments[0])
        (calls,) = [c for c in run_job(text, tmp_path, {"SLURM_JOB_ID": str(job)}) if "torchrun" in c][:1]
        ports.add(int(next(w for w in calls if w.startswith("--rdzv_endpoint=")).rsplit(":", 1)[1]))
        (tmp_path / "argv").unlink()
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(20000 <= p < 30000 <= low for p in ports) and len(ports) == 22


# A Job as the options give it: every field, valid values only.
name = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
jobs = st.builds(
    Job,
    nodes=st.none() | st.integers(1, 64), procs_per_node=st.none() | st.integers(1, 8),
    partition=st.just("") | name, time=st.just("") | st.sampled_from(["00:05:00", "1-02:00:00"]),
    image=st.just("") | name.map(lambda n: f"/apps/{n}.sqsh"), runtime=st.sampled_from(RUNTIMES),
    mounts=st.just("") | name.map(lambda n: f"/fsx/{n}:/data"), exclude=st.lists(name, max_size=3).map(tuple),
    after=st.lists(st.integers(1, 10**6).map(str), max_size=3).map(tuple), array=st.booleans(),
    max_parallel=st.integers(0, 4), retries=st.integers(0, 3), mpi_launcher=st.sampled_from(MPI_LAUNCHERS),
    srun_mpi=st.sampled_from(["", "pmix", "pmi2"]))


@settings(max_examples=200, deadline=None)
@given(job=jobs)
def test_a_job_is_what_its_options_give_back(job: Job) -> None:
    """Job.argv() (what `reproduce` passes each step it submits) read by the options' parser gives back the
    same Job: one set of options, spelled once."""
    args = build_parser().parse_args(["submit", "param-demo", *job.argv()])
    assert options.job(args) == job


@pytest.mark.parametrize(("fields", "message"), [
    ({"nodes": 0}, "--nodes 0: give a whole number >= 1"),
    ({"time": "90 minutes"}, "--time '90 minutes' is not a Slurm time"),
    ({"runtime": "docker"}, "--runtime 'docker' is not one of pyxis, oci, apptainer"),
    ({"mpi_launcher": "mpirun"}, "--mpi-launcher 'mpirun' is not one of"),
    ({"srun_mpi": "pmix;id"}, "--srun-mpi 'pmix;id' is not an srun --mpi plugin name"),
    ({"exclude": ("node 7",)}, "--exclude 'node 7' is not a node name"),
    ({"after": ("12x",)}, "--after '12x' is not a Slurm job id"),
    ({"partition": "a b"}, "--partition 'a b' is not a Slurm partition name"),
    ({"image": "/x\nIMAGE=/y"}, "--image"),
])
def test_a_job_refuses_a_bad_option_naming_it(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ReproflowError, match=re.escape(message)):
        Job(**fields)  # type: ignore[arg-type]
