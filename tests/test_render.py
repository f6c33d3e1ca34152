"""sbatch scripts: committed files match the template, parse as bash, carry the cluster conventions."""

from __future__ import annotations

import subprocess
import sys

import jinja2
import pytest
from conftest import ROOT, reproflow

from reproflow.launch.render import render_sbatch, sbatch_path
from reproflow.launch.submit import SubmititExecutor
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
    for needle in ("#SBATCH --exclusive", "#SBATCH --output=%x_%j.out", ': "${IMAGE=', "--container-image",
                   "--container-mounts", "srun --export=ALL", "--rdzv_endpoint=\"$HEAD_NODE:$MASTER_PORT\"",
                   "export FI_PROVIDER=efa", "export NCCL_DEBUG=INFO", "scontrol show hostnames"):
        assert needle in text, needle


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


def test_submit_dry_run_prints_the_submitit_script():
    proc = reproflow("submit", "param-comms", "--nodes", "2", "--procs-per-node", "2", "--image", "/apps/x.sqsh",
                     "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for needle in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "--container-image=/apps/x.sqsh",
                   "submitit.core._submit", "export REPROFLOW_IMAGE=/apps/x.sqsh"):
        assert needle in proc.stdout, needle
    # Inside the image the tasks run the image's Python, not this process's path, which it need not hold.
    assert " python3 -u -m submitit.core._submit" in proc.stdout and sys.executable not in proc.stdout


def test_an_images_tasks_read_the_suite_from_the_mounted_results(tmp_path):
    """Only the results folder is mounted in the image: the suite file is copied there, by content."""
    suite = load_suite(ROOT / "workflows" / "param-demo.toml")
    results = tmp_path / "results"
    executor = SubmititExecutor(results, ROOT, image="/apps/x.sqsh")
    seen = executor._visible(suite).path
    assert seen.is_relative_to(results.resolve()) and seen.name == "param-demo.toml"
    assert seen.read_bytes() == suite.path.read_bytes() and executor._visible(suite).path == seen
    assert SubmititExecutor(results, ROOT)._visible(suite) is suite


def test_run_dry_run_runs_nothing(tmp_path):
    proc = reproflow("run", "param-demo", "--dry-run", "--results", str(tmp_path))
    assert proc.returncode == 0 and "collective=all_gather" in proc.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["list", "run", "render", "submit", "status", "report"])
def test_every_command_explains_itself(command):
    proc = reproflow(command, "--help")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) > 5


def test_an_mpi_suites_tasks_are_one_mpi_world_through_srun():
    """submitit's srun of an MPI suite names the --mpi plugin (SRUN_MPI, else the image's, else pmix)."""
    proc = reproflow("submit", "spatial-small", "-e", "check-resnet", "--dry-run")
    assert proc.returncode == 0 and "--mpi=pmix" in proc.stdout, proc.stderr
    proc = reproflow("submit", "spatial-small", "-e", "check-resnet", "--dry-run", env={"SRUN_MPI": "pmi2"})
    assert "--mpi=pmi2" in proc.stdout
    assert "--mpi=" not in reproflow("submit", "param-demo", "-e", "comms", "--dry-run").stdout
