"""Where and how a job ran: the provenance columns of every row (commit, image, job, host), the
machine's hardware, and each job's environment file with its secrets redacted."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import reproflow
from reproflow.store.files import atomic_write, json_object


@dataclass(frozen=True)
class Provenance:
    """Where and how a job ran; written into every row."""

    job_id: str
    nodelist: str
    world_size: int
    backend: str
    device: str
    device_name: str
    torch_version: str
    nccl_version: str
    git_commit: str
    image: str
    image_sha256: str
    # How the job's steps ran in the image (pyxis, oci, apptainer; empty: no container), and with Pyxis
    # the Enroot version of its nodes, as the job script found them.
    container_runtime: str = ""
    enroot_version: str = ""
    # 1 for a first submission; a retry of an infrastructure failure counts up and names the job it retries.
    attempt: int = 1
    retry_of: str = ""
    # The all-reduce check made on the allocation before any point: pass, fail, or off.
    health_gate: str = "off"
    health_detail: str = ""
    # The links between hosts: a local run's emulated network or loopback; empty on a cluster (its own).
    network: str = ""
    # CPU cores rank 0 may run on: a CPU run with more ranks per host than cores measures time-sharing.
    host_cpus: int = 0
    # The run the job belongs to (store.runs): the invoking process's id, else one per Slurm job.
    run_id: str = ""

    def columns(self) -> dict[str, Any]:
        """Provenance as row columns (point_rows and timestamp are added at write time)."""
        return asdict(self) | {"reproflow_version": reproflow.__version__}


@cache
def git_commit(root: str) -> str:
    """The checkout's commit (with `-dirty` when it has local changes), or REPROFLOW_GIT_COMMIT.

    Containers bake the commit into REPROFLOW_GIT_COMMIT because they carry no .git folder.
    """
    if os.environ.get("REPROFLOW_GIT_COMMIT"):
        return os.environ["REPROFLOW_GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def file_sha256(path: str) -> str:
    """sha256 of a file (the container's squash file), or '' when it is not a readable file.

    A `<file>.sha256` written by `make containers` after the file is used instead of reading
    gigabytes at every job start.
    """
    if not path or not os.path.isfile(path):
        return ""
    sidecar = path + ".sha256"
    if os.path.isfile(sidecar) and os.path.getmtime(sidecar) >= os.path.getmtime(path):
        with open(sidecar) as fh:
            recorded = fh.read().split()
        if recorded and len(recorded[0]) == 64:
            return recorded[0]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_sha256(image: str) -> str:
    """The image's sha256: what the job script read on the host (REPROFLOW_IMAGE_SHA256; inside a
    container the squash file itself is out of sight), else the file's own."""
    return os.environ.get("REPROFLOW_IMAGE_SHA256") or file_sha256(image)


def job_identity() -> tuple[str, str]:
    """(job id, image) from the environment the executors set.

    Slurm array tasks get `<job>_<task>`. A squash file given as image is recorded by path.
    """
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("REPROFLOW_JOB_ID") or f"pid{os.getpid()}"
    if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return job, os.environ.get("REPROFLOW_IMAGE", "")


def machine_name() -> str:
    """Name of the processor a rank measured on, for the `device_name` column."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# What is recorded of a job's environment: the variables that explain a measurement (communication
# libraries, fabrics, threading, MPI and the scheduler's placement, the container runtime, Python's and
# reproflow's own). Any other variable is named without its value, since a shared results folder or
# archive must not carry what a user's shell happened to hold (a package index's token, a cloud key).
_RECORDED_PREFIXES = ("NCCL_", "NVSHMEM_", "CUDA_", "CUDNN_", "CUBLAS_", "NVIDIA_", "FI_", "UCX_", "OMP_", "GOMP_",
                      "KMP_", "MKL_", "OPENBLAS_", "OMPI_", "PMIX_", "PMI_", "MV2_", "MPICH_", "I_MPI_", "HYDRA_",
                      "SLURM_", "SLURMD_", "ENROOT_", "PYXIS_", "APPTAINER_", "SINGULARITY_", "REPROFLOW_",
                      "TORCH_", "TORCHELASTIC_", "PYTORCH_", "GLOO_", "TRITON_", "MALLOC_", "LC_")
_RECORDED_NAMES = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                   "GROUP_RANK", "NODE_RANK", "HOSTNAME", "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH",
                   "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LANG", "TZ", "PWD",
                   "SHELL", "TMPDIR", "GLIBC_TUNABLES", "MAX_JOBS", "container"}
NOT_RECORDED = "<not recorded>"
REDACTED = "<redacted>"

# Words of a name (split at '_', '-', '.' and camelCase) that mark a secret: SLURM_JWT, GITHUB_PAT, DB_PASS,
# MYSQL_PWD, AWS_ACCESS_KEYS, AZURE_STORAGE_SAS, SENTRY_DSN, AccountKey, sig (a SAS URL's signature), ...
_SECRET_WORDS = {"pass", "pwd", "pw", "key", "keys", "apikey", "accountkey", "accesskey", "secretkey", "privatekey",
                 "auth", "authorization", "bearer", "jwt", "pat", "sas", "dsn", "sig", "signature", "session",
                 "private", "cookie", "cookies", "credential", "credentials", "creds", "passphrase"}
_SECRET_PARTS = ("secret", "token", "passw", "jwt", "credential", "connectionstring", "connection_string",
                 "connstr", "conn_str")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def is_secret_name(name: str) -> bool:
    """Whether a variable, parameter or key of this name holds a secret (by the words of the name)."""
    words = [w.lower() for w in _WORD.findall(name)]
    joined = "_".join(words)
    return any(w in _SECRET_WORDS for w in words) or any(p in joined or p in name.lower() for p in _SECRET_PARTS)


# The user information of a URL (`https://tok@host`, `https://:tok@host`, `postgres://me:pw@db`): a name
# with no password is a token, so it goes too; a user name before a colon stays.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s?#]*)(?P<pw>:[^/@\s?#]*)?@")
# NAME=value inside a value, ended by a blank or a separator of query strings, option lists and
# connection strings (`?user=a&password=x`, `A=1,HF_TOKEN=x`, `AccountKey=x;`), and `--name value` of a
# command line; a quoted value runs to its closing quote. Slurm's SLURM_EXPORT_ENV repeats what
# `sbatch --export=...,API_TOKEN=x` set.
_QUOTED_OR_WORD = r"(?:\"[^\"]*\"?|'[^']*'?|[^,;&\s\"']*)"
_ASSIGNMENT = re.compile(rf"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>{_QUOTED_OR_WORD})")
_OPTION = re.compile(rf"(?P<name>--?[A-Za-z][A-Za-z0-9_-]*)\s+(?!-)(?P<value>{_QUOTED_OR_WORD})")
# `name: value` of free text (YAML, a log line; a URL's colon has no blank after it); an HTTP credential's
# scheme word is left to _SCHEME_CREDENTIAL.
_COLON = re.compile(rf"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:[ \t]+(?!(?:Bearer|Basic|Token)\b)"
                    rf"(?P<value>{_QUOTED_OR_WORD})", re.IGNORECASE)
# The password option of the common clients (mysql, sshpass, ...): `-p value`.
_SHORT_PASSWORD = re.compile(rf"(?<![\w-])-p[ \t]+(?!-)(?P<value>{_QUOTED_OR_WORD})")
# An HTTP credential inside a value: `Authorization: Bearer x`, `Basic x`, `token x`.
_SCHEME_CREDENTIAL = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def _redact_userinfo(m: re.Match[str]) -> str:
    if m["pw"] is None:
        return f"{m['scheme']}{REDACTED}@" if m["user"] else m[0]
    return f"{m['scheme']}{m['user']}:{REDACTED}@"


def redact_value(value: str) -> str:
    """`value` with URL user information, secret-named assignments, options and `name: value` pairs, a
    client's `-p` password and HTTP credentials replaced."""
    value = _URL_USERINFO.sub(_redact_userinfo, value)
    value = _SCHEME_CREDENTIAL.sub(lambda m: f"{m[1]} {REDACTED}", value)
    for pattern, sep in ((_ASSIGNMENT, "="), (_OPTION, " "), (_COLON, ": ")):
        value = pattern.sub(lambda m, sep=sep: f"{m['name']}{sep}{REDACTED}" if is_secret_name(m["name"]) else m[0],
                            value)
    return _SHORT_PASSWORD.sub(f"-p {REDACTED}", value)


def is_recorded(name: str) -> bool:
    """Whether a variable's value is written into the job's environment file."""
    return name in _RECORDED_NAMES or name.startswith(_RECORDED_PREFIXES)


def redact_environment(env: Mapping[str, str]) -> dict[str, str]:
    """Every name of `env`; the values of the variables that explain a measurement with their secrets
    redacted, <redacted> for secret names, <not recorded> for the rest."""
    def shown(name: str, value: str) -> str:
        if value in (REDACTED, NOT_RECORDED):  # a record redacted before (an archive redacts again)
            return value
        if is_secret_name(name):
            return REDACTED
        return redact_value(value) if is_recorded(name) else NOT_RECORDED
    return {name: shown(name, value) for name, value in sorted(env.items())}


def redact_record(text: str) -> str:
    """An environment file's text with its environment redacted again (by today's rules, as an archive
    needs for files written by older versions); text that is not such a record is refused."""
    record = json_object(text)
    if record is None or not isinstance(record.get("environment"), dict):
        raise ValueError("not a JSON object with an 'environment' object")
    record["environment"] = redact_environment({str(k): str(v) for k, v in record["environment"].items()})
    return json.dumps(record, indent=1) + "\n"


def _proc_field(path: str, name: str) -> str:
    """The first `name: value` of a /proc file ('' where there is none, e.g. off Linux)."""
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> set[str]:
    """This CPU's feature flags (x86 `flags`, Arm `Features`; empty where /proc/cpuinfo has neither)."""
    return set((_proc_field("/proc/cpuinfo", "flags") or _proc_field("/proc/cpuinfo", "Features")).split())


def hardware() -> dict[str, object]:
    """What this host measures on: CPU model and cores, memory, the GPUs torch sees, OS and Python."""
    torch = sys.modules.get("torch")  # already loaded by the job; the report reads the record without it
    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch is not None and torch.cuda.is_available() else [])
    memory_kib = _proc_field("/proc/meminfo", "MemTotal").split(" ")[0]
    return {"cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
            "cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_gib": round(int(memory_kib) / 2**20, 1) if memory_kib.isdigit() else None,
            "gpus": gpus, "os": platform.platform(), "python": platform.python_version()}


def write_environment(results: Path, suite: str, job_id: str, host: str, ranks: Sequence[int]) -> Path:
    """Record the hardware and the environment this job runs with (secrets redacted) next to its results."""
    path = results / suite / "env" / f"{job_id}-{host}.json"
    record = {"job_id": job_id, "host": host, "ranks": list(ranks), "hardware": hardware(),
              "environment": redact_environment(os.environ)}
    atomic_write(path, json.dumps(record, indent=1) + "\n", under=results)
    return path
