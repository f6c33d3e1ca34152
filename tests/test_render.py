"""sbatch scripts: committed files match the template, parse as bash, carry the cluster conventions."""

from __future__ import annotations

import subprocess
import sys

import jinja2
import pytest
from conftest import ROOT, reproflow

from reproflow.launch.job import Job
from reproflow.launch.render import render_sbatch, sbatch_path
from reproflow.launch.submit import SlurmExecutor
from reproflow.spec.suite import load_suite

SUITES = sorted((ROOT / "workflows").glob("*.toml"))


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_committed_script_matches_its_template(path):
    suite = load_suite(path)
    committed = sbatch_path(ROOT, suite)
    assert committed.exists(), f"{committed} is missing: run `make sbatch`"
    rendered = render_sbatch(suite, ROOT)
    if committed.read_text() != rendered:
        pytest.fail(f"{committed} differs from its template's output; run `make sbatch` if the change is intended")


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_script_is_valid_bash_with_the_recipe_conventions(path):
    script = sbatch_path(ROOT, load_suite(path))
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for needle in ("#SBATCH --output=%x_%j.out", "#SBATCH --export=NONE", ': "${IMAGE=',
                   'source "$REPROFLOW_CHECKOUT/templates/job.sh"', "\nfinish\n"):
        assert needle in text, needle
    # The job itself, written once for every script: the recipe's conventions are there.
    job = ROOT / "templates" / "job.sh"
    subprocess.run(["bash", "-n", str(job)], check=True)
    for needle in ("--container-image", "--container-mounts", "srun --export=ALL",
                   "--rdzv_endpoint=\"$HEAD_NODE:$MASTER_PORT\"", "export FI_PROVIDER=efa", "export NCCL_DEBUG=INFO",
                   "scontrol show hostnames"):
        assert needle in job.read_text(), needle


def test_gpu_suites_request_gpus_per_node():
    text = (ROOT / "sbatch" / "param-comms.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --nodes=2" in text
    assert "#SBATCH --gpus-per-node" not in (ROOT / "sbatch" / "param-demo.sbatch").read_text()


def test_template_variables_are_strict(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / "param.Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "templates" / "suite.sbatch.j2").write_text("{{ no_such_variable }}")
    with pytest.raises(jinja2.UndefinedError):
        render_sbatch(load_suite(SUITES[0]), tmp_path)


def test_render_check_passes_on_the_checkout():
    proc = reproflow("render", "--check")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("argv", [["render", "--check"], ["reproduce", "--estimate"], ["list", "--suites"]])
def test_commands_that_run_nothing_load_no_model(argv: list[str]) -> None:
    """A command that runs nothing reads the suites' shape and no family's cross-field checks, which
    import torch and build models: it answers in a second, not the tens of seconds those take."""
    probe = ("import sys, runpy; sys.argv = ['reproflow', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('reproflow.app.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("no torch"), proc.stdout[-500:] + proc.stderr[-2000:]


def test_submit_dry_run_prints_the_job_script(tmp_path):
    """The dry run prints the sbatch command and the exact script, writes nothing: the suite's job for
    the experiment, its #SBATCH lines and variables from the options."""
    proc = reproflow("submit", "param-comms", "--nodes", "2", "--procs-per-node", "2", "--image", "/apps/x.sqsh",
                     "--runtime", "oci", "--partition", "gpu", "--time", "00:05:00", "--results", str(tmp_path / "r"),
                     "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for needle in ("# sbatch --parsable --output=", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                   "#SBATCH --partition=gpu", "#SBATCH --time=00:05:00", "IMAGE=/apps/x.sqsh", "CONTAINER_RUNTIME=oci",
                   'source "$REPROFLOW_CHECKOUT/templates/job.sh"', "run_experiment collectives"):
        assert needle in proc.stdout, needle
    assert not (tmp_path / "r").exists()


def test_an_images_tasks_read_the_suite_from_the_mounted_results(tmp_path):
    """Inside the image the checkout is the image's: the suite file is copied to the results, by content."""
    suite = load_suite(ROOT / "workflows" / "param-demo.toml")
    results = tmp_path / "results"
    executor = SlurmExecutor(results=results, root=ROOT, job=Job(image="/apps/x.sqsh"))
    seen = executor._visible(suite).path
    assert seen.is_relative_to(results.resolve()) and seen.name == "param-demo.toml"
    assert seen.read_bytes() == suite.path.read_bytes() and executor._visible(suite).path == seen
    assert SlurmExecutor(results=results, root=ROOT)._visible(suite) is suite


def test_run_dry_run_runs_nothing(tmp_path):
    proc = reproflow("run", "param-demo", "--dry-run", "--results", str(tmp_path))
    assert proc.returncode == 0 and "collective=all_gather" in proc.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["list", "run", "render", "submit", "status", "report"])
def test_every_command_explains_itself(command):
    proc = reproflow(command, "--help")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) > 5
