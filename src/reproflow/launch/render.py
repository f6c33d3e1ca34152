"""Render a job script: a pure function of what differs between jobs and the template.

Every job, a committed sbatch/<suite>.sbatch or one `reproflow submit` writes, is the same
templates/job.sh with a few lines before it (#SBATCH options, variables, the experiments). The
scripts in sbatch/ are committed so cluster users need no Python to submit; `make sbatch` rewrites
them and a test fails when a committed script differs from what this renders.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from reproflow.spec.errors import CONTROL, ReproflowError, SuiteError, shown, text_problem
from reproflow.spec.suite import Experiment, Suite, format_slurm_time, slurm_seconds

TEMPLATE = "suite.sbatch.j2"


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


@dataclass(frozen=True, kw_only=True)
class JobScript:
    """What a job script holds besides templates/job.sh, the job itself: what differs between jobs."""

    suite: Suite
    experiments: tuple[Experiment, ...]
    job_name: str
    nodes: int
    time_limit: str  # Slurm's [D-]HH:MM:SS
    tasks_per_node: int = 1  # Slurm's tasks; each experiment starts its ranks itself (torchrun, MPI)
    options: tuple[str, ...] = ()  # further #SBATCH options, each one word
    variables: tuple[str, ...] = ()  # shell lines that set the job's variables before job.sh reads them
    checkout: str = ""  # submitted: the checkout holding templates/job.sh, a shell word (committed: found)
    submitted: bool = False  # written by `reproflow submit` (else: a committed sbatch/<suite>.sbatch)


def render_job(script: JobScript, root: Path) -> str:
    """The job script: a pure function of `script` and the template. A SuiteError where it would be longer
    than sbatch takes (MAX_SCRIPT_BYTES)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["comment"] = comment
    # A job `reproflow submit` writes reads the suite where the submitting process names it (a copy on the
    # shared results folder when it runs in an image); a committed one, in the checkout it runs.
    suite_file = script.suite.path.resolve().as_posix() if script.submitted else suite_file_for_job(
        script.suite.path, root)
    text = env.get_template(TEMPLATE).render(
        suite=script.suite,
        experiments=script.experiments,
        job_name=script.job_name,
        nodes=script.nodes,
        tasks_per_node=script.tasks_per_node,
        gpus_per_node=max(e.launch.gpus_per_node for e in script.experiments),
        exclusive=any(e.launch.exclusive for e in script.experiments),
        time_limit=script.time_limit,
        options=script.options,
        variables=script.variables,
        checkout=script.checkout,
        submitted=script.submitted,
        suite_file=suite_file,
        suite_arg=shlex.quote(suite_file),  # one shell word, whatever the path holds
        quote=shlex.quote,
    )
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise SuiteError(script.suite.path, "suite", f"its sbatch script would be {len(text.encode()):,} bytes, "
                         f"more than the {MAX_SCRIPT_BYTES:,} sbatch takes by default (Slurm's max_script_size).",
                         "a shorter description, fewer experiments")
    return text


def render_sbatch(suite: Suite, root: Path) -> str:
    """The committed script of `suite` (sbatch/<name>.sbatch): every experiment, in the suite's launch."""
    image = default_image(suite, root)
    partition = suite.experiments[0].launch.partition
    return render_job(JobScript(
        suite=suite,
        experiments=tuple(suite.experiments),
        job_name=f"reproflow-{suite.name}",
        nodes=max(e.launch.nodes for e in suite.experiments),
        time_limit=format_slurm_time(sum(slurm_seconds(e.launch.time_limit) for e in suite.experiments)),
        options=("--output=%x_%j.out", *([f"--partition={partition}"] if partition else [])),
        variables=(': "${APPS_PATH:=/apps}"',
                   f': "${{IMAGE={image}}}"  # squash file from `make containers` (absolute or ./ path); empty: '
                   "no container"),
    ), root)


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


def suite_file_for_job(path: Path, root: Path) -> str:
    """The suite file as a job names it: relative to the checkout when it is part of it (job.sh reads it
    under $REPROFLOW_DIR, the image's checkout in a container), else its absolute path."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def sbatch_path(root: Path, suite: Suite) -> Path:
    """Where a suite's committed script lives."""
    return root / "sbatch" / f"{suite.name}.sbatch"
