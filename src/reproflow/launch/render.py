"""Render the sbatch script of a suite: a pure function of the suite and the template.

The scripts in sbatch/ are committed so cluster users need no Python to submit; `make sbatch`
rewrites them and a test fails when a committed script differs from what this renders.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from reproflow.spec.errors import CONTROL, ReproflowError, SuiteError, shown, text_problem
from reproflow.spec.suite import Suite, format_slurm_time, slurm_seconds

TEMPLATE = "suite.sbatch.j2"


@dataclass(frozen=True)
class SbatchSettings:
    """Defaults written into the script's user-variable block; each can be overridden at submit time."""

    apps_path: str = "/apps"
    container_dir: str = "/opt/reproflow"
    master_port: int = 20000


DOCKERFILE = Path("containers") / "reproflow.Dockerfile"


def image_flavours(root: Path) -> list[str]:
    """The images `make containers` can build: each `<flavour>-stack` stage of the Dockerfile."""
    dockerfile = root / DOCKERFILE
    text = dockerfile.read_text() if dockerfile.is_file() else ""
    return re.findall(r"^FROM\s+\S+\s+AS\s+([a-z0-9]+)-stack\s*$", text, re.M | re.I)


def default_image(suite: Suite, root: Path) -> str:
    """The squash file `make containers` builds for the suite's `container` flavour; '' for none."""
    if not suite.container:
        return ""
    flavours = image_flavours(root)
    if suite.container not in flavours:
        raise SuiteError(suite.path, "suite.container", f"{DOCKERFILE} builds no {suite.container!r} image.",
                         ", ".join(flavours) or f"none: {DOCKERFILE} is missing")
    return f"$APPS_PATH/reproflow-{suite.container}.sqsh"


# Slurm's default max_script_size (slurm.conf SchedulerParameters): sbatch refuses a longer script.
MAX_SCRIPT_BYTES = 4 * 2**20


def render_sbatch(suite: Suite, root: Path, settings: SbatchSettings = SbatchSettings()) -> str:
    """The sbatch script that runs every experiment of `suite`, one torchrun launch each; a SuiteError
    where it would be longer than sbatch takes (MAX_SCRIPT_BYTES)."""
    text = _render(suite, root, settings)
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise SuiteError(suite.path, "suite", f"its sbatch script would be {len(text.encode()):,} bytes, more than "
                         f"the {MAX_SCRIPT_BYTES:,} sbatch takes by default (Slurm's max_script_size).",
                         "a shorter description, fewer experiments")
    return text


def _render(suite: Suite, root: Path, settings: SbatchSettings) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["comment"] = comment
    launch = suite.experiments[0].launch
    total_s = sum(slurm_seconds(e.launch.time_limit) for e in suite.experiments)
    ref = _suite_ref(suite.path, root)
    return env.get_template(TEMPLATE).render(
        suite=suite,
        suite_ref=ref,
        # One shell word: $REPROFLOW_DIR expands, the rest of the path is quoted whatever it holds.
        suite_arg=f'"$REPROFLOW_DIR"/{shlex.quote(ref[len(_IN_CHECKOUT):])}' if ref.startswith(_IN_CHECKOUT)
        else shlex.quote(ref),
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


_IN_CHECKOUT = "$REPROFLOW_DIR/"


def comment(text: object) -> str:
    """Free text (descriptions, paths) made safe for one `#` comment line of a shell script."""
    return CONTROL.sub(" ", str(text))


def shell_value(option: str, value: str) -> str:
    """`value` if it can sit on one line of a job script (once quoted), else an error naming the option."""
    problem = text_problem(value)
    if problem:
        raise ReproflowError(f"{option} {shown(value)} {problem}, which a job script cannot hold. Give a plain "
                             "value on one line.")
    return value


def _suite_ref(path: Path, root: Path) -> str:
    """The suite file as the job sees it: under $REPROFLOW_DIR when it is part of the checkout."""
    try:
        return _IN_CHECKOUT + path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def sbatch_path(root: Path, suite: Suite) -> Path:
    """Where a suite's committed script lives."""
    return root / "sbatch" / f"{suite.name}.sbatch"
