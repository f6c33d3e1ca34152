"""Container definitions are pinned, `make containers` says what is missing, rows record the image."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

import pandas as pd
import pytest
from conftest import ROOT, reproflow

from reproflow.results import file_sha256

DOCKERFILES = sorted((ROOT / "containers").glob("*.Dockerfile"))


def _pip_packages(text: str):
    """Package arguments of every `pip install` (options, paths and option arguments left out)."""
    for command in re.findall(r"pip install ([^&\n]*)", text.replace("\\\n", " ")):
        takes_value = False
        for token in command.split():
            if takes_value:
                takes_value = False
            elif token in ("--no-binary", "-r", "--requirement"):
                takes_value = True
            elif not token.startswith(("-", "/")):
                yield token


def test_one_dockerfile_per_family_group():
    assert {p.name.split(".")[0] for p in DOCKERFILES} == {"param", "megatron", "spatial"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.stem)
def test_every_version_is_pinned(path):
    text = path.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and ":" in base.group(1).rsplit("/", 1)[-1] and not base.group(1).endswith(":latest")
    assert "FROM ${BASE_IMAGE}" in text
    packages = list(_pip_packages(text))
    assert all("==" in p for p in packages), (path.name, packages)
    assert "COPY . /opt/reproflow" in text and "REPROFLOW_GIT_COMMIT" in text


def test_param_image_pins_the_recipe_commit():
    text = (ROOT / "containers" / "param.Dockerfile").read_text()
    assert "ARG PARAM_COMMIT=6236487e8969838822b52298c2a2318f6ac47bbd" in text
    assert "checkout ${PARAM_COMMIT}" in text


def test_requirements_are_pinned_and_leave_torch_to_the_base_image():
    lines = [ln for ln in (ROOT / "containers" / "requirements.txt").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", ln) for ln in lines)
    assert not any(ln.startswith("torch") for ln in lines)


@pytest.mark.skipif(shutil.which("enroot") is not None, reason="enroot is installed here")
def test_make_containers_names_what_is_missing():
    proc = subprocess.run(["bash", "containers/build.sh"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "enroot" in proc.stderr and "cannot build here" in proc.stderr


def test_sha256_of_the_image_and_its_sidecar(tmp_path):
    image = tmp_path / "x.sqsh"
    image.write_bytes(b"squash" * 1000)
    real = hashlib.sha256(image.read_bytes()).hexdigest()
    assert file_sha256(str(image)) == real
    (tmp_path / "x.sqsh.sha256").write_text("f" * 64 + "  x.sqsh\n")
    assert file_sha256(str(image)) == "f" * 64
    assert file_sha256(str(tmp_path / "missing.sqsh")) == ""


@pytest.mark.distributed
def test_rows_record_the_image_and_its_sha256(write_suite, tmp_path):
    image = tmp_path / "reproflow-param.sqsh"
    image.write_bytes(b"not really squashfs")
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


@pytest.mark.skipif(shutil.which("enroot") is not None, reason="enroot is installed here")
def test_doctor_names_missing_pyxis_and_enroot_with_the_fix():
    proc = reproflow("doctor", "--image", "apps/reproflow-param.sqsh")
    assert proc.returncode == 1
    out = proc.stdout
    assert "[FAIL] enroot not found" in out and "fix: install enroot on every node" in out
    assert "Pyxis" in out and "--container-image" in out
    assert "not an absolute or ./ path" in out and "use ./apps/reproflow-param.sqsh" in out
    assert "Traceback" not in proc.stderr
