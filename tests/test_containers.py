"""The images: one Dockerfile whose cpu and gpu flavours share every step but the base and the CUDA-only
ones, all Python packages from constraints.txt; the CPU image make test builds (its squash file made by
`enroot import`, its sidecars, the versions inside it); every family run inside it on the 2-node test
cluster through Pyxis and Enroot, and through Slurm's OCI support; bad images and runtimes refused with
the fix before anything runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, mpi_start_failed, reproflow
from slurmtools import IMAGE, NEEDS_IMAGE, NEEDS_PYXIS, SMOKE, cluster, sacct, sbatch, wait  # noqa: F401
from test_versions import canonical, differences, locked

from reproflow.launch.containers import image_problem, runtime_problems
from reproflow.launch.doctor import check_image
from reproflow.launch.render import image_flavours
from reproflow.store.provenance import file_sha256

DOCKERFILE = ROOT / "containers" / "reproflow.Dockerfile"
FAMILIES = {"comms": "param_comms", "gemm": "param_compute", "resharding": "resharding", "aceso-train": "aceso",
            "cfp": "cfp", "spatial": "spatial"}


def stages() -> dict[str, tuple[str, str]]:
    """Each stage of the Dockerfile: name -> (what it is built FROM, its instructions)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    parts = re.split(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", text, flags=re.M)
    return {parts[i + 1]: (parts[i], parts[i + 2]) for i in range(1, len(parts) - 2, 3)}


def installed_by_name(body: str):
    """Package names given to `pip install` in a stage (options, their values and paths left out)."""
    for command in re.findall(r"pip install ([^&\n]*)", body):
        takes_value = False
        for token in command.split():
            if takes_value:
                takes_value = False
            elif token in ("--find-links", "--extra-index-url", "--index-url", "-r", "-c", "-e", "--no-binary"):
                takes_value = True
            elif not token.startswith(("-", "/", '"', "$")):
                yield token


def test_one_dockerfile_whose_flavours_share_every_step_but_the_cuda_ones():
    s = stages()
    assert list(s) == ["python", "cpu-stack", "gpu-stack", "image"]
    assert s["python"][0] == "${BASE_IMAGE}" and s["image"][0] == "${STACK}"
    assert s["cpu-stack"][0] == s["gpu-stack"][0] == "python"
    # The cpu flavour builds nothing of its own: only its base and the srun --mpi plugin its MPICH takes differ.
    assert not re.search(r"^RUN\b", s["cpu-stack"][1], re.M) and "REPROFLOW_SRUN_MPI=pmi2" in s["cpu-stack"][1]
    gpu = s["gpu-stack"][1]
    for cuda_only in ("REPROFLOW_SRUN_MPI=pmix", "efa_installer.sh", "aws-ofi-nccl", 'nvidia-nccl-cu${cuda_major}',
                      "--with-cuda=/usr/local/cuda",
                      "MPICC=/opt/openmpi/bin/mpicc pip install --no-binary mpi4py", "APEX_CUDA_EXT=1",
                      "import apex, fused_layer_norm_cuda", "DS_BUILD_FUSED_ADAM=1", "nccl-tests",
                      'fetch-source /opt/param "${PARAM_COMMIT}"', "mpi_built_with_cuda_support:value:true"):
        assert cuda_only in gpu, cuda_only
    assert image_flavours(ROOT) == ["cpu", "gpu"]


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run([hadolint, "--config", str(ROOT / "containers" / "hadolint.yaml"), str(DOCKERFILE),
                           str(ROOT / "containers" / "cuda-standin.Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_python_package_comes_at_the_locked_version():
    s = stages()
    first_stage = s["python"][1]
    assert "PIP_CONSTRAINT=/opt/reproflow/constraints.txt" in first_stage
    assert first_stage.index("PIP_CONSTRAINT") < first_stage.index("pip install")
    assert "COPY constraints.txt" in first_stage
    pins = locked()
    named = [token for _, body in s.values() for token in installed_by_name(body)]
    assert sorted(named) == ["deepspeed", "mpi4py"]  # the gpu flavour rebuilds these two from source
    for token in named:
        assert canonical(token) in pins, f"{token} is installed by name but not pinned in constraints.txt"


def test_every_other_version_is_pinned_and_every_source_by_commit_or_sha256():
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and ":" in base.group(1).rsplit("/", 1)[-1] and not base.group(1).endswith(":latest")
    args = dict(re.findall(r"^ARG (\w+(?:VERSION|_COMMIT|_SHA256))=(\S+)$", text, re.M))
    assert {"EFA_INSTALLER_VERSION", "AWS_OFI_NCCL_COMMIT", "OPENMPI_SHA256", "APEX_COMMIT", "PARAM_COMMIT",
            "NCCL_TESTS_COMMIT", "GDRCOPY_COMMIT", "LIBFABRIC_COMMIT"} <= set(args)
    args.pop("REPROFLOW_GIT_COMMIT")  # the checkout's, given by make containers
    for name, value in args.items():
        form = "[0-9a-f]{64}" if name.endswith("_SHA256") else "[0-9a-f]{40}" if name.endswith("_COMMIT") else \
            r"\d+(\.\d+)+"
        assert re.fullmatch(form, value), (name, value)
    assert args["PARAM_COMMIT"] == "6236487e8969838822b52298c2a2318f6ac47bbd"  # the AWS recipe's pin
    # Every third-party source goes through fetch-source with one of those pins; none is cloned by hand.
    fetched = re.findall(r"fetch-source (\S+) \"(?:sha256:)?\$\{(\w+)\}\"", text)
    assert {arg for _, arg in fetched} == {"GDRCOPY_COMMIT", "LIBFABRIC_COMMIT", "AWS_OFI_NCCL_COMMIT",
                                          "OPENMPI_SHA256", "APEX_COMMIT", "PARAM_COMMIT", "NCCL_TESTS_COMMIT"}
    assert "git clone" not in text


def pins(tmp_path: Path, dockerfile: str | None = None, standin: str | None = None,
         constraints: str | None = None) -> subprocess.CompletedProcess:
    """containers/pins.py on the project's files, or on copies with the given texts."""
    paths = []
    for option, text, name in (("--dockerfile", dockerfile, "reproflow.Dockerfile"),
                               ("--standin", standin, "cuda-standin.Dockerfile"), ("--constraints", constraints,
                                                                                   "constraints.txt")):
        if text is not None:
            (tmp_path / name).write_text(text)
            paths += [option, str(tmp_path / name)]
    return subprocess.run([sys.executable, "containers/pins.py", *paths], cwd=ROOT, capture_output=True, text=True)


def test_the_gpu_flavours_pins_agree_on_one_cuda(tmp_path):
    proc = pins(tmp_path)
    assert proc.returncode == 0 and "pins agree on one CUDA" in proc.stdout, proc.stderr


# The four defects the gpu flavour once had (base 12.9.1 with the cu129 index, nvidia-nccl-cu12, apex 25.07,
# aws-ofi-nccl v1.16.0), each put back alone, and the ways the other pins can drift.
DRIFTS = {
    "cu129-index": ("ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130",
                    "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129",
                    "has no torch 2.13.0 (PyTorch builds it for CUDA 12.6, 13.0, 13.2), so pip takes PyPI's CUDA 13.0"),
    "cuda-12.9-base": ("ARG BASE_IMAGE=nvidia/cuda:13.0.2-", "ARG BASE_IMAGE=nvidia/cuda:12.9.1-",
                       "is CUDA 12.9 but torch 2.13.0 is the CUDA 13.0 build"),
    "nccl-cu12": ('pip show "nvidia-nccl-cu${cuda_major}"', "pip show nvidia-nccl-cu12",
                  "reads the package nvidia-*-cu12, but torch 2.13.0 brings nvidia-*-cu13"),
    "apex-25.07": ("ARG APEX_COMMIT=6424da3b4faa6c8f062da4a48c424fff3f02d42d", "ARG APEX_COMMIT=25.07",
                   "apex 25.07 ignores APEX_CPP_EXT/APEX_CUDA_EXT"),
    "apex-25.09": ("ARG APEX_COMMIT=6424da3b4faa6c8f062da4a48c424fff3f02d42d", "ARG APEX_COMMIT=25.09",
                   "apex 25.09 compiles for CUDA 12 at most (it hard-codes compute_70"),
    "apex-unknown": ("ARG APEX_COMMIT=6424da3b4faa6c8f062da4a48c424fff3f02d42d", "ARG APEX_COMMIT=" + "0" * 40,
                     "is not in containers/pins.py's APEX table"),
    "ofi-1.16": ("ARG AWS_OFI_NCCL_VERSION=1.21.1", "ARG AWS_OFI_NCCL_VERSION=v1.16.0",
                 "ARG AWS_OFI_NCCL_VERSION=v1.16.0 does not compile against CUDA 13 headers: pin 1.17.0 or later"),
    "libfabric-vs-efa": ("ARG LIBFABRIC_VERSION=2.6.0", "ARG LIBFABRIC_VERSION=1.17.0",
                         "is not the 2.6.0 EFA installer 1.50.0 brings"),
    "efa-unknown": ("ARG EFA_INSTALLER_VERSION=1.50.0", "ARG EFA_INSTALLER_VERSION=9.9.9",
                    "EFA installer 9.9.9 is not in containers/pins.py's EFA_LIBFABRIC table"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_the_pin_check_fails_on_each_disagreement(tmp_path, drift):
    old, new, message = DRIFTS[drift]
    text = DOCKERFILE.read_text()
    assert old in text
    proc = pins(tmp_path, dockerfile=text.replace(old, new))
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("reproflow.Dockerfile: ")


def test_the_pin_check_holds_the_stand_in_toolchain_and_the_lock(tmp_path):
    standin = (ROOT / "containers" / "cuda-standin.Dockerfile").read_text()
    proc = pins(tmp_path, standin=standin.replace("CUDA_TOOLKIT_VERSION=13.0.3", "CUDA_TOOLKIT_VERSION=12.9.1"))
    assert proc.returncode == 1
    assert "cuda-standin.Dockerfile: ARG CUDA_TOOLKIT_VERSION=12.9.1 is not the cuda-toolkit torch 2.13.0 requires " \
           "(13.0.3)" in proc.stderr
    constraints = (ROOT / "constraints.txt").read_text().replace("torch==2.13.0", "torch==2.14.0")
    proc = pins(tmp_path, constraints=constraints)
    assert proc.returncode == 1 and "torch==2.14.0 is not in containers/pins.py's TORCH table" in proc.stderr


def git_archive(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A small repository, and a `git archive` tarball of its commit named like the mirror's."""
    repo = tmp_path / f"{name}-repo"
    repo.mkdir()
    (repo / "README").write_text(f"{name}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    tarball = mirror / f"{name}-1.0.tar.gz"
    subprocess.run([*git, "archive", "--format=tar.gz", f"--prefix={name}-1.0/", "-o", str(tarball), commit],
                   check=True)
    return repo, commit


def fetch_source(tmp_path: Path, *args: str, mirror: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "containers/fetch-source.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "SOURCE_MIRROR": str(mirror)})


def test_fetch_source_takes_the_mirror_first_then_upstream_and_checks_every_pin(tmp_path):
    repo, commit = git_archive(tmp_path, "thing")
    mirror = tmp_path / "mirror"
    # The mirror's tarball is found by the commit git archive recorded in it, whatever its name.
    proc = fetch_source(tmp_path, str(tmp_path / "a"), commit, "https://example.invalid/thing.git", mirror=mirror)
    assert proc.returncode == 0 and f"{commit} from the mirror's thing-1.0.tar.gz" in proc.stderr, proc.stderr
    assert (tmp_path / "a" / "README").read_text() == "thing\n"
    # Without it, upstream at the same commit.
    proc = fetch_source(tmp_path, str(tmp_path / "b"), commit, str(repo), mirror=tmp_path / "empty")
    assert proc.returncode == 0 and f"{commit} from {repo}" in proc.stderr, proc.stderr
    assert (tmp_path / "b" / "README").is_file() and not (tmp_path / "b" / ".git").exists()
    # A release tarball by sha256: the mirror's file, or a download whose sha256 must match.
    tarball = mirror / "thing-1.0.tar.gz"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    proc = fetch_source(tmp_path, str(tmp_path / "c"), f"sha256:{digest}", "https://example.invalid/t.tgz",
                        mirror=mirror)
    assert proc.returncode == 0 and (tmp_path / "c" / "README").is_file(), proc.stderr
    proc = fetch_source(tmp_path, str(tmp_path / "d"), "sha256:" + "0" * 64, f"file://{tarball}", mirror=mirror)
    assert proc.returncode == 1 and f"file://{tarball} (its sha256 is not {'0' * 64})" in proc.stderr, proc.stderr
    # Nothing at the pin: what was tried, and the fix; nothing written.
    proc = fetch_source(tmp_path, str(tmp_path / "e"), "1" * 40, "https://example.invalid/thing.git", mirror=mirror)
    assert proc.returncode == 1 and f"no source at {'1' * 40}; tried:" in proc.stderr
    assert f"{mirror} (no tarball at this pin)" in proc.stderr and "https://example.invalid/thing.git (" in proc.stderr
    assert "put the pinned tarball in the mirror folder" in proc.stderr and not (tmp_path / "e").exists()
    proc = fetch_source(tmp_path, str(tmp_path / "f"), "main", "https://example.invalid/thing.git", mirror=mirror)
    assert proc.returncode == 2 and "PIN 'main' is neither a 40-digit commit nor sha256:<hex>" in proc.stderr


def test_doctor_names_what_the_images_build_left_out(tmp_path):
    image = tmp_path / "reproflow-gpu.sqsh"
    header = bytearray(96)
    header[:4] = b"hsqs"
    header[40:48] = (96).to_bytes(8, "little")
    image.write_bytes(bytes(header))
    assert [c.status for c in check_image(str(image))] == ["ok"]
    (tmp_path / "reproflow-gpu.sqsh.json").write_text(json.dumps(
        {"flavour": "gpu", "skipped": {"efa-installer": "efa-installer.amazonaws.com is not reachable"}}))
    checks = check_image(str(image))
    assert [c.status for c in checks] == ["ok", "warn"]
    assert checks[1].what == f"image {image} was built without efa-installer: efa-installer.amazonaws.com is " \
                             "not reachable" and "make containers" in checks[1].fix


def test_the_images_install_pyprojects_requirements():
    out = subprocess.run([sys.executable, "containers/requirements.py", "pyproject.toml", "megatron", "deepspeed",
                          "mpi"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    assert "torch==2.13.0" in out and "megatron-core==0.16.1" in out and "mpich>=4.2" in out
    bad = subprocess.run([sys.executable, "containers/requirements.py", "pyproject.toml", "cuda"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "no extra cuda" in bad.stderr and "Traceback" not in bad.stderr


def test_make_containers_names_what_would_work():
    proc = subprocess.run(["bash", "containers/build.sh", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "BUILDER": "no-such-builder", "APPS": "/nonexistent"})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "BUILDER=no-such-builder is not installed; docker, podman or buildah can build" in proc.stderr
    proc = subprocess.run(["bash", "containers/build.sh", "arm"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "no flavour 'arm': choose gpu or cpu" in proc.stderr
    proc = subprocess.run(["bash", "containers/check-gpu-image.sh", "/nonexistent"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert proc.stderr == "no /nonexistent/reproflow-gpu.sqsh (and .json): build it with make gpu-image-here\n"
    if shutil.which("podman"):
        proc = subprocess.run(["bash", "containers/build.sh", "gpu"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "BUILDER": "podman", "BUILD_CA": "/nonexistent/ca.crt",
                                   "APPS": "/nonexistent"})
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1
        assert "BUILD_CA=/nonexistent/ca.crt does not exist: name a CA bundle file, or BUILD_CA= for none" \
            in proc.stderr


@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed (tests/packages.sh installs it)")
def test_a_failed_build_names_the_step(tmp_path):
    dockerfile = tmp_path / "broken.Dockerfile"
    dockerfile.write_text("FROM scratch AS image\nCOPY constraints.txt /c.txt\nRUN exit 3\n")
    proc = subprocess.run(["bash", "containers/build.sh", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "BUILDER": "buildah", "APPS": str(tmp_path), "DOCKERFILE": str(dockerfile),
                               "BASE_IMAGE": "scratch"})
    assert proc.returncode == 1
    assert "building reproflow-cpu failed at STEP 3/3: RUN exit 3" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "reproflow-cpu.sqsh").exists()


def test_sha256_of_the_image_and_its_sidecar(tmp_path):
    image = tmp_path / "x.sqsh"
    image.write_bytes(b"squash" * 1000)
    real = hashlib.sha256(image.read_bytes()).hexdigest()
    assert file_sha256(str(image)) == real
    (tmp_path / "x.sqsh.sha256").write_text("f" * 64 + "  x.sqsh\n")
    assert file_sha256(str(image)) == "f" * 64
    assert file_sha256(str(tmp_path / "missing.sqsh")) == ""


def test_a_squash_file_shorter_than_its_header_says_is_refused(tmp_path):
    """A squashfs superblock records the file's length (bytes_used at byte 40): a copy cut short is named
    before a job starts (doctor, submit; the job script makes the same check)."""
    header = bytearray(96)
    header[:4] = b"hsqs"
    header[40:48] = (4096).to_bytes(8, "little")
    image = tmp_path / "x.sqsh"
    image.write_bytes(bytes(header) + b"\0" * 4000)
    assert image_problem(str(image)) == ""
    image.write_bytes(bytes(header) + b"\0" * 1000)
    assert "is cut short: it holds 1096 bytes of the 4096 its squashfs header records" in image_problem(str(image))


@pytest.mark.distributed
def test_rows_record_the_image_and_its_sha256(write_suite, tmp_path):
    image = tmp_path / "reproflow-cpu.sqsh"
    image.write_bytes(b"hsqs and more")
    suite = write_suite("""
        [[experiment]]
        name = "c"
        family = "param_comms"
        launch = { procs_per_node = 2, backend = "gloo", device = "cpu" }
        params = { begin_size = "1K", end_size = "1K", iters = 1, warmup_iters = 0 }
    """)
    proc = reproflow("run", str(suite), "--results", str(tmp_path / "r"), env={"REPROFLOW_IMAGE": str(image)})
    assert proc.returncode == 0, proc.stderr
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "r").rglob("*.csv"))
    assert set(rows["image"]) == {str(image)}
    assert set(rows["image_sha256"]) == {hashlib.sha256(image.read_bytes()).hexdigest()}
    # Inside a container the job script passes the sha256 it read on the host.
    proc = reproflow("run", str(suite), "--force", "--results", str(tmp_path / "r2"),
                     env={"REPROFLOW_IMAGE": str(image), "REPROFLOW_IMAGE_SHA256": "a" * 64})
    rows = pd.concat(pd.read_csv(p) for p in (tmp_path / "r2").rglob("*.csv"))
    assert set(rows["image_sha256"]) == {"a" * 64}


@NEEDS_IMAGE
def test_the_cpu_image_squash_file_and_its_sidecars():
    image = Path(IMAGE)
    with image.open("rb") as fh:
        assert fh.read(4) == b"hsqs"
    digest = hashlib.sha256()
    with image.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    assert Path(IMAGE + ".sha256").read_text().split() == [digest.hexdigest(), image.name]
    meta = json.loads(Path(IMAGE + ".json").read_text())
    assert meta["flavour"] == "cpu" and re.fullmatch(r"(sha256:)?[0-9a-f]{64}", meta["image_id"]), meta
    assert meta["constraints_sha256"] == hashlib.sha256((ROOT / "constraints.txt").read_bytes()).hexdigest()
    environment = subprocess.run(["unsquashfs", "-cat", IMAGE, "etc/environment"], capture_output=True, text=True,
                                 check=True).stdout
    assert "REPROFLOW_ROOT=/opt/reproflow" in environment and "PIP_CONSTRAINT=" in environment


@NEEDS_IMAGE
def test_the_cpu_image_holds_exactly_the_locked_versions():
    listing = subprocess.run(["unsquashfs", "-l", IMAGE, "usr/local/lib/python3.11/site-packages"],
                             capture_output=True, text=True, check=True).stdout
    found = {}
    for name, version in re.findall(r"site-packages/([A-Za-z0-9_.]+?)-([0-9][^/-]*)\.dist-info$", listing, re.M):
        found[canonical(name)] = version
    assert found.pop("torch") == "2.13.0+cpu"
    found = {n: v for n, v in found.items() if n not in ("pip", "reproflow")}
    assert len(found) > 30
    assert differences(found, locked()) == []


def _table(results: Path) -> pd.DataFrame:
    return pd.concat(pd.read_csv(p, dtype=str) for p in results.rglob("*.csv") if "/env/" not in str(p))


def enroot_version() -> str:
    return subprocess.run(["enroot", "version"], capture_output=True, text=True).stdout.strip()


@NEEDS_IMAGE
@pytest.mark.slurm
@pytest.mark.parametrize("runtime", [pytest.param("pyxis", marks=NEEDS_PYXIS), "oci"])
@pytest.mark.parametrize("path", ["sbatch", "submit"])
def test_every_family_runs_inside_the_cpu_image_on_two_nodes(cluster, tmp_path, runtime, path):  # noqa: F811
    """The smoke suite in the CPU image's squash file, a point of every family on both nodes, through both
    paths to one job script: `sbatch -N 2 --export=NONE` of the committed script, and `reproflow submit
    --wait`, a job per experiment. With the default runtime, Pyxis and Enroot (fails where the test cluster
    does not load Pyxis: the job refuses to start), spatial's MPI ranks through `srun --mpi=pmi2`, the plugin
    the image names for its MPICH; through Slurm's OCI support (runc), through hydra started by hand."""
    results = tmp_path / "results"
    start = time.monotonic()
    # The same job again, resuming, where MPI's start-up failed the first time (mpi_start_failed): the test
    # cluster's pmi2 wire-up, not what is tested.
    if path == "sbatch":
        export = f"NONE,IMAGE={IMAGE},RESULTS={results}" + ("" if runtime == "pyxis" else ",CONTAINER_RUNTIME=oci")
        for attempt in range(2):
            job = sbatch("-N", "2", f"--export={export}", str(SMOKE), cwd=tmp_path)
            state = wait(job, timeout=900)[job]
            log = (tmp_path / f"reproflow-smoke_{job}.out").read_text()
            if attempt or state["state"] == "COMPLETED" or not mpi_start_failed(log):
                break
            print(f"job {job}: MPI's start-up failed; submitting again. Its log:\n{log[-2000:]}", flush=True)
        assert state["state"] == "COMPLETED", log[-4000:]
        how = f"sbatch -N 2 --export={export.replace(str(results), '<results>')} smoke.sbatch"
    else:
        for attempt in range(2):
            proc = reproflow("submit", "smoke", "--nodes", "2", "--image", IMAGE, "--runtime", runtime, "--results",
                             str(results), "--wait", timeout=1800)
            log = "\n".join(p.read_text() for p in sorted((results / "smoke" / "jobs").glob("*.out")))
            if attempt or proc.returncode == 0 or not mpi_start_failed(log):
                break
            print(f"MPI's start-up failed; submitting again. Its jobs' logs:\n{log[-2000:]}", flush=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
        recorded = (results / "smoke" / "jobs.jsonl").read_text().splitlines()
        job = ",".join(json.loads(line)["job_id"] for line in recorded)
        how = f"reproflow submit smoke --nodes 2 --image <image> --runtime {runtime} --wait"
    seconds = time.monotonic() - start
    launcher = "srun --mpi=pmi2" if runtime == "pyxis" else "hydra"  # pmi2: the image's MPI, MPICH, says so
    assert f"MPI rank(s) per node through {launcher}" in log and "check against the unsplit model" in log
    enroot = enroot_version() if runtime == "pyxis" else ""
    rows = _table(results).fillna("")
    sha = Path(IMAGE + ".sha256").read_text().split()[0]
    summary = []
    for experiment, family in FAMILIES.items():
        mine = rows[rows["experiment"] == experiment]
        assert set(mine["family"]) == {family}, experiment
        assert set(mine["nodelist"]) == {"node1,node2"}, experiment
        assert set(mine["image"]) == {IMAGE} and set(mine["image_sha256"]) - {""} == {sha}, experiment
        assert set(mine["container_runtime"]) == {runtime} and set(mine["enroot_version"]) == {enroot}, experiment
        summary.append(f"| {family} | {experiment} | {len(mine)} | {mine['nodelist'].iloc[0]} | "
                       f"{mine['world_size'].iloc[0]} | {runtime} | {enroot or '-'} | {sha[:16]} |")
    assert set(rows["git_commit"]) == {json.loads(Path(IMAGE + ".json").read_text())["git_commit"]}
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / f"in-container-{runtime}-{path}.md").write_text(
        f"Job {job}: {how}, {seconds:.0f} s from submission to COMPLETED\n\n| family | experiment | rows | nodes | "
        "ranks | container runtime | Enroot | image sha256 |\n|---|---|---|---|---|---|---|---|\n"
        + "\n".join(summary) + "\n")


@NEEDS_IMAGE
@pytest.mark.slurm
@pytest.mark.parametrize("image,runtime,message", [
    ("not-squash", "oci", "is not a squash file (it does not start with squashfs' magic)"),
    ("cpu-image", "apptainer", "CONTAINER_RUNTIME=apptainer, but apptainer is not installed here"),
    ("cpu-image", "pyxis", "srun does not know --container-image: Pyxis is not installed or not enabled"),
    ("cpu-image", "docker", "CONTAINER_RUNTIME=docker is not one of pyxis, oci, apptainer"),
], ids=["not-squash", "no-apptainer", "no-pyxis", "unknown-runtime"])
def test_a_job_refuses_an_image_or_runtime_it_cannot_start(cluster, tmp_path, image, runtime, message):  # noqa: F811
    """(The faults a Pyxis job meets with a loaded Pyxis are in test_faults.py.)"""
    if runtime == "pyxis" and not runtime_problems("pyxis"):
        pytest.skip("the test cluster loads Pyxis here")
    if image == "not-squash":
        image = str(tmp_path / "image.sqsh")
        Path(image).write_bytes(b"PK\x03\x04 a zip file")
    elif image == "cpu-image":
        image = IMAGE
    job = sbatch("-N", "2", f"--export=NONE,IMAGE={image},CONTAINER_RUNTIME={runtime},RESULTS={tmp_path / 'r'}",
                 str(ROOT / "sbatch" / "smoke.sbatch"), cwd=tmp_path)
    state = wait(job)[job]
    log = (tmp_path / f"reproflow-smoke_{job}.out").read_text()
    assert state["state"] == "FAILED" and message in log, log
    assert "experiment comms" not in log  # refused before any step


@pytest.mark.slurm
def test_doctor_checks_the_runtime_the_jobs_will_use(cluster, tmp_path):  # noqa: F811
    not_squash = tmp_path / "x.sqsh"
    not_squash.write_text("text")
    oci = reproflow("doctor", "--runtime", "oci", "--image", IMAGE or str(not_squash), "--results", str(tmp_path))
    assert "[  ok] container runtime oci ready" in oci.stdout, oci.stdout
    apptainer = reproflow("doctor", "--runtime", "apptainer", "--image", str(not_squash), "--results", str(tmp_path))
    assert apptainer.returncode == 1 and "[FAIL] apptainer not found" in apptainer.stdout
    assert f"[FAIL] image {not_squash} is not a squash file" in apptainer.stdout
    pyxis = reproflow("doctor", "--image", "apps/reproflow-gpu.sqsh", "--results", str(tmp_path))
    if not runtime_problems("pyxis"):
        assert "[  ok] container runtime pyxis ready" in pyxis.stdout, pyxis.stdout
    else:
        assert "[FAIL] Pyxis is not active" in pyxis.stdout, pyxis.stdout
    assert "is not an absolute or ./ path, so Pyxis would pull it from a registry" in pyxis.stdout
    assert "Traceback" not in oci.stderr + apptainer.stderr + pyxis.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("args,message", [
    (["--image", "apps/x.sqsh"], "is not an absolute or ./ path, so Pyxis would pull it from a registry"),
    (["--image", "{not_squash}"], "is not a squash file"),
    (["--image", "{not_squash}", "--runtime", "apptainer"], "apptainer not found"),
    (["--image", "{not_squash}", "--runtime", "oci"], "is not a squash file"),
], ids=["registry-name", "not-squash", "no-apptainer", "oci-not-squash"])
def test_submit_refuses_before_anything_is_submitted(cluster, tmp_path, args, message):  # noqa: F811
    not_squash = tmp_path / "x.sqsh"
    not_squash.write_text("text")
    args = [a.replace("{not_squash}", str(not_squash)) for a in args]
    proc = reproflow("submit", "smoke", "-e", "comms", "--results", str(tmp_path / "r"), *args)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "r" / "smoke" / "jobs.jsonl").exists()
