"""Container images and the runtimes that start them under Slurm.

An image is a squash file from `make containers`, given by an absolute or ./ path (anything else Pyxis
reads as a registry reference). Three runtimes start it, chosen per job: Pyxis (srun
--container-image; Enroot), Slurm's own OCI support (srun --container with the runtime oci.conf names,
e.g. runc) and Apptainer. `reproflow doctor` prints these checks; `reproflow submit` refuses to submit
when one fails; the sbatch scripts make the same checks when the job starts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from reproflow.launch.shell import output

RUNTIMES = ("pyxis", "oci", "apptainer")
SQUASHFS_MAGIC = b"hsqs"
SQUASHFS_HEADER = 96  # a squashfs 4 superblock


def image_problem(image: str, *, on_disk: bool = True) -> str:
    """'' when `image` is a squash file the runtimes can start, else what is wrong and the fix.
    Without `on_disk` only the path's form is checked (a dry run may name a file built later)."""
    if not image:
        return ""
    if not image.startswith(("/", "./")):
        return (f"image {image!r} is not an absolute or ./ path, so Pyxis would pull it from a registry: give "
                f"the squash file's path (./{image} or absolute), e.g. one `make containers` wrote")
    if not on_disk:
        return ""
    path = Path(image)
    if not path.is_file():
        return f"image {image} does not exist: build it with `make containers`, or fix the path"
    with path.open("rb") as fh:
        head = fh.read(SQUASHFS_HEADER)
    if head[:len(SQUASHFS_MAGIC)] != SQUASHFS_MAGIC:
        return (f"image {image} is not a squash file (it does not start with squashfs' magic 'hsqs'): "
                "build one with `make containers`, or `enroot import` an image")
    # The header records the file's length (bytes_used, at byte 40): a shorter file is a copy cut short.
    recorded, size = int.from_bytes(head[40:48].ljust(8, b"\0"), "little"), path.stat().st_size
    if recorded > size:
        return (f"image {image} is cut short: it holds {size} bytes of the {recorded} its squashfs header records: "
                "copy it again, or rebuild it with `make containers`")
    return ""


def image_skipped(image: str) -> dict[str, str]:
    """What the image's build left out (part -> why): from its .json sidecar, else the names the image
    records in its environment (REPROFLOW_IMAGE_SKIPPED, read with unsquashfs)."""
    sidecar = Path(image + ".json")
    if sidecar.is_file():
        try:
            return dict(json.loads(sidecar.read_text()).get("skipped", {}))
        except (ValueError, TypeError):
            return {}
    skipped = image_variable(image, "REPROFLOW_IMAGE_SKIPPED")
    return {part: "the image records it as skipped" for part in skipped.split()}


def image_variable(image: str, name: str) -> str:
    """A variable the image records in its environment (etc/environment, read with unsquashfs); '' when
    it records none, the file is no image, or unsquashfs is missing."""
    try:
        if not image or not Path(image).is_file() or not shutil.which("unsquashfs"):
            return ""
    except ValueError:  # a path no file can have (a NUL byte): image_problem says what is wrong
        return ""
    found = re.search(rf"^{name}=(.*)$", output(["unsquashfs", "-cat", image, "etc/environment"]), re.M)
    return found.group(1).strip() if found else ""


def oci_conf() -> Path:
    """Where Slurm reads oci.conf: beside the slurm.conf the controller reports (else /etc/slurm)."""
    found = re.search(r"^SLURM_CONF\s*=\s*(\S+)", output(["scontrol", "show", "config"]), re.M)
    return Path(found.group(1) if found else "/etc/slurm/slurm.conf").parent / "oci.conf"


def runtime_problems(runtime: str) -> list[tuple[str, str]]:
    """(what is missing, the fix) for each thing `runtime` needs here; [] when it can start images."""
    if runtime not in RUNTIMES:
        return [(f"container runtime {runtime!r} is not one of {', '.join(RUNTIMES)}", "choose one of them")]
    problems = []
    if runtime == "pyxis":
        if "--container-image" not in (output(["srun", "--help"]) if shutil.which("srun") else ""):
            problems.append(("Pyxis is not active: srun does not know --container-image",
                             "install Pyxis (github.com/NVIDIA/pyxis) and add `required /usr/local/lib/slurm/"
                             "spank_pyxis.so` to plugstack.conf (ParallelCluster >= 3.11.1 ships it disabled: "
                             "enable it in the cluster config); or use --runtime oci / apptainer"))
        for tool, fix in (("enroot", "install enroot on every node (github.com/NVIDIA/enroot/releases: the enroot "
                                     "and enroot+caps packages)"),
                          ("unsquashfs", "install squashfs-tools on every node: enroot unpacks squash files with "
                                         "it")):
            if not shutil.which(tool):
                problems.append((f"{tool} not found", fix))
    elif runtime == "oci":
        conf = oci_conf()
        if not conf.is_file():
            problems.append((f"Slurm's OCI support is not set up: no {conf}",
                             "write oci.conf beside slurm.conf with RunTimeRun (and RunTimeQuery, RunTimeKill, "
                             "RunTimeDelete) for runc or crun, as tests/slurm/start.sh does; see docs/containers.md"))
        else:
            run = re.search(r'^\s*RunTimeRun\s*=\s*"?(\S+)', conf.read_text(), re.M | re.I)
            if not run:
                problems.append((f"{conf} has no RunTimeRun", "name the OCI runtime's run command in it"))
            elif not shutil.which(run.group(1)):
                problems.append((f"the OCI runtime {run.group(1)} that {conf} runs is not installed",
                                 f"install {run.group(1)} on every node (Debian: apt-get install runc)"))
        if not shutil.which("unsquashfs"):
            problems.append(("unsquashfs not found: jobs unpack the squash file into an OCI bundle with it",
                             "install squashfs-tools on every node"))
    elif not shutil.which("apptainer"):
        problems.append(("apptainer not found", "install Apptainer on every node (apptainer.org/docs/admin), or "
                                                "use --runtime pyxis / oci"))
    return problems
