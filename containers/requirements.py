"""Print reproflow's requirements from pyproject.toml, one per line: its dependencies and the named extras.

The images install these (versions from constraints.txt, through PIP_CONSTRAINT) before the project's
source is copied in, so that layer is rebuilt only when pyproject.toml changes; `make containers`
prepares their wheels the same way. Standard library only (Python 3.11+): it runs in a bare base image.

    python3 containers/requirements.py pyproject.toml megatron deepspeed mpi
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    """The project's dependencies plus those of `extras`, in pyproject.toml's order."""
    with open(pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: no extra {', '.join(unknown)} in {pyproject} (it has: "
                         f"{', '.join(optional)})")
    return list(project["dependencies"]) + [r for e in extras for r in optional[e]]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
