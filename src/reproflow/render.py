"""Render the sbatch script of a suite: a pure function of the suite and the template.

The scripts in sbatch/ are committed so cluster users need no Python to submit; `make sbatch`
rewrites them and a test fails when a committed script differs from what this renders.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from reproflow.errors import SuiteError
from reproflow.suite import Suite, format_slurm_time, slurm_seconds

TEMPLATE = "suite.sbatch.j2"


@dataclass(frozen=True)
class SbatchSettings:
    """Defaults written into the script's user-variable block; each can be overridden at submit time."""

    apps_path: str = "/apps"
    container_dir: str = "/opt/reproflow"
    master_port: int = 20000


def default_image(suite: Suite, root: Path) -> str:
    """The squash file `make containers` builds for the suite's `container`; '' for none."""
    if not suite.container:
        return ""
    if not (root / "containers" / f"{suite.container}.Dockerfile").is_file():
        known = ", ".join(sorted(p.name.split(".")[0] for p in (root / "containers").glob("*.Dockerfile")))
        raise SuiteError(suite.path, "suite.container", f"there is no containers/{suite.container}.Dockerfile.", known)
    return f"$APPS_PATH/reproflow-{suite.container}.sqsh"


def render_sbatch(suite: Suite, root: Path, settings: SbatchSettings = SbatchSettings()) -> str:
    """The sbatch script that runs every experiment of `suite`, one torchrun launch each."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    launch = suite.experiments[0].launch
    total_s = sum(slurm_seconds(e.launch.time_limit) for e in suite.experiments)
    return env.get_template(TEMPLATE).render(
        suite=suite,
        suite_file=_suite_ref(suite.path, root),
        nodes=max(e.launch.nodes for e in suite.experiments),
        gpus_per_node=max(e.launch.gpus_per_node for e in suite.experiments),
        time_limit=format_slurm_time(total_s),
        partition=launch.partition,
        exclusive=launch.exclusive,
        settings=settings,
        image=default_image(suite, root),
        mpi=any(e.launch.launcher == "mpi" for e in suite.experiments),
        quote=shlex.quote,
    )


def _suite_ref(path: Path, root: Path) -> str:
    """The suite file as the job sees it: under $REPROFLOW_DIR when it is part of the checkout."""
    try:
        return "$REPROFLOW_DIR/" + path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def sbatch_path(root: Path, suite: Suite) -> Path:
    """Where a suite's committed script lives."""
    return root / "sbatch" / f"{suite.name}.sbatch"
