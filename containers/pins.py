"""The gpu flavour's pins, held to one CUDA version: the torch build constraints.txt locks (from the index
the Dockerfile names, or PyPI's), the base image, the stand-in base's toolchain, the nvidia-* package names
the Dockerfile reads, and the releases of apex, aws-ofi-nccl and libfabric that build with that CUDA.

    python containers/pins.py [--dockerfile F] [--standin F] [--constraints F]

Prints one line per disagreement, naming the file, the ARG and the fix, and exits 1; make test runs it
and containers/build.sh runs it before every gpu build. The release facts it checks against are below,
each with where it comes from; a pin the tables do not know is a disagreement too (add what it builds).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class TorchRelease(NamedTuple):
    pypi: str  # the CUDA of PyPI's default wheel
    indexes: tuple[str, ...]  # the CUDA builds on download.pytorch.org/whl/cuXYZ
    toolkit: str  # its cuda-toolkit[...]==X.Y.Z requirement


# PyTorch's release matrix and the wheels' metadata (pip install --dry-run --report torch==X).
TORCH = {"2.13.0": TorchRelease(pypi="13.0", indexes=("12.6", "13.0", "13.2"), toolkit="13.0.3")}

# What each apex ref builds (its setup.py): (takes APEX_CPP_EXT/APEX_CUDA_EXT, newest CUDA major it compiles
# for). 25.07 ignores the variables (they arrived in 25.09); up to 25.09 one extension hard-codes
# compute_70, which nvcc 13 rejects; main's 26bba57d removed it, in no release tag yet.
APEX = {
    "25.07": (False, 12),
    "25.09": (True, 12),
    "6424da3b4faa6c8f062da4a48c424fff3f02d42d": (True, 13),  # main, 2026-07-08, contains 26bba57d
}

# aws-ofi-nccl: v1.17.0 is the first to compile against CUDA 13 headers (PFN_cuCtxGetDevice is gone there);
# its --enable-platform-aws needs libfabric >= 1.22 (m4/ax_platform_aws.m4).
OFI_NCCL_FOR_CUDA = {12: (1, 0, 0), 13: (1, 17, 0)}
LIBFABRIC_FOR_AWS = (1, 22)

# The libfabric each EFA installer brings (AWS's EFA release notes): the source build that stands in for the
# installer is held to the same release.
EFA_LIBFABRIC = {"1.42.0": "2.1.0", "1.50.0": "2.6.0"}


def version(text: str) -> tuple[int, ...]:
    """'v1.21.1' -> (1, 21, 1)."""
    return tuple(int(p) for p in re.findall(r"\d+", text))


def args_of(dockerfile: Path) -> dict[str, str]:
    """Every `ARG NAME=value` of a Dockerfile (quotes stripped)."""
    return {k: v.strip('"') for k, v in re.findall(r"^ARG (\w+)=(.*)$", dockerfile.read_text(), re.M)}


def locked_torch(constraints: Path) -> str:
    found = re.search(r"^torch==(\S+)$", constraints.read_text(), re.M)
    return found.group(1) if found else ""


def problems(dockerfile: Path, standin: Path, constraints: Path) -> list[str]:
    """Each disagreement among the pins, as one line naming the file, the ARG and the fix."""
    args, out = args_of(dockerfile), []
    where = dockerfile.name

    def need(name: str) -> str:
        if name not in args:
            out.append(f"{where}: no ARG {name}: pin it (the check reads it)")
        return args.get(name, "")

    torch = locked_torch(constraints)
    release = TORCH.get(torch)
    if release is None:
        return [f"{constraints.name}: torch=={torch or '?'} is not in containers/pins.py's TORCH table: add its "
                "PyPI CUDA, its download.pytorch.org CUDA builds and its cuda-toolkit pin"]

    # Which CUDA build pip installs: the index's when it has this torch, else PyPI's default wheel.
    index = need("TORCH_INDEX_URL")
    found = re.search(r"/whl/cu(\d+)(\d)/?$", index)
    torch_cuda = release.pypi
    if found:
        index_cuda = f"{found.group(1)}.{found.group(2)}"
        if index_cuda in release.indexes:
            torch_cuda = index_cuda
        else:
            out.append(f"{where}: ARG TORCH_INDEX_URL={index} has no torch {torch} (PyTorch builds it for CUDA "
                       f"{', '.join(release.indexes)}), so pip takes PyPI's CUDA {release.pypi} build: use "
                       f"https://download.pytorch.org/whl/cu{release.pypi.replace('.', '')}")
    major = int(torch_cuda.split(".")[0])

    base = need("BASE_IMAGE")
    found = re.match(r"nvidia/cuda:(\d+\.\d+)\.\d+-", base)
    if not found:
        out.append(f"{where}: ARG BASE_IMAGE={base} is not an nvidia/cuda:X.Y.Z-... image: the check cannot read "
                   "its CUDA version")
    elif found.group(1) != torch_cuda:
        out.append(f"{where}: ARG BASE_IMAGE={base} is CUDA {found.group(1)} but torch {torch} is the CUDA "
                   f"{torch_cuda} build (apex wants nvcc's version equal to torch's, DeepSpeed major.minor): "
                   f"use an nvidia/cuda:{torch_cuda}.x-cudnn-devel image")

    toolkit = args_of(standin).get("CUDA_TOOLKIT_VERSION", "")
    if toolkit != release.toolkit:
        out.append(f"{standin.name}: ARG CUDA_TOOLKIT_VERSION={toolkit or '?'} is not the cuda-toolkit torch "
                   f"{torch} requires ({release.toolkit}): pin that")

    text = dockerfile.read_text()
    for name in sorted(set(re.findall(r"\bnvidia-[a-z]+-cu(\d+)\b", text))):
        if int(name) != major:
            out.append(f"{where}: reads the package nvidia-*-cu{name}, but torch {torch} brings nvidia-*-cu{major}: "
                       "derive the name from torch.version.cuda")

    # APEX_REF was the pin's name while it was a release tag.
    apex = args.get("APEX_REF") or need("APEX_COMMIT")
    known = APEX.get(apex)
    good = next((ref for ref, (takes_env, newest) in APEX.items() if takes_env and newest >= major), "?")
    if known is None:
        out.append(f"{where}: apex at {apex} is not in containers/pins.py's APEX table: add whether it takes "
                   "APEX_CPP_EXT/APEX_CUDA_EXT and the newest CUDA it compiles for")
    elif not known[0]:
        out.append(f"{where}: apex {apex} ignores APEX_CPP_EXT/APEX_CUDA_EXT (they arrived in 25.09): it would build "
                   f"no extension; pin {good}")
    elif known[1] < major:
        out.append(f"{where}: apex {apex} compiles for CUDA {known[1]} at most (it hard-codes compute_70, which "
                   f"nvcc {major} rejects): pin {good}")

    ofi = need("AWS_OFI_NCCL_VERSION")
    least = OFI_NCCL_FOR_CUDA.get(major, (99,))
    if ofi and version(ofi) < least:
        out.append(f"{where}: ARG AWS_OFI_NCCL_VERSION={ofi} does not compile against CUDA {major} headers: "
                   f"pin {'.'.join(map(str, least))} or later")

    efa = need("EFA_INSTALLER_VERSION")
    libfabric = args.get("LIBFABRIC_VERSION", "")
    brought = EFA_LIBFABRIC.get(efa)
    if brought is None:
        out.append(f"{where}: EFA installer {efa} is not in containers/pins.py's EFA_LIBFABRIC table: add the "
                   "libfabric it brings (AWS's EFA release notes)")
    elif libfabric and libfabric != brought:
        out.append(f"{where}: ARG LIBFABRIC_VERSION={libfabric or '?'} (built when the EFA installer is skipped) "
                   f"is not the {brought} EFA installer {efa} brings: pin {brought}")
    for source, release_ in (("LIBFABRIC_VERSION", libfabric), ("EFA installer's libfabric", brought or "")):
        if release_ and version(release_)[:2] < LIBFABRIC_FOR_AWS:
            out.append(f"{where}: {source} {release_} is older than the libfabric 1.22 aws-ofi-nccl's "
                       "--enable-platform-aws needs")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dockerfile", type=Path, default=ROOT / "containers" / "reproflow.Dockerfile")
    parser.add_argument("--standin", type=Path, default=ROOT / "containers" / "cuda-standin.Dockerfile")
    parser.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt")
    opts = parser.parse_args(argv)
    for path in (opts.dockerfile, opts.standin, opts.constraints):
        if not path.is_file():
            parser.error(f"{path} does not exist")
    found = problems(opts.dockerfile, opts.standin, opts.constraints)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"containers/pins.py: the gpu flavour's pins agree on one CUDA ({opts.dockerfile.name})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
