"""The Python API: the example of docs/api.md runs as written, and bad input raises the CLI's errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import reproflow
from reproflow.spec.errors import ReproflowError

pytestmark = [pytest.mark.distributed]


def test_the_documented_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    assert len(blocks) == 1
    proc = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "('comms', 1)" in proc.stdout and "'report.html'" in proc.stdout, proc.stdout
    assert list((tmp_path / "results" / "smoke" / "comms").glob("*.csv"))
    assert (tmp_path / "reports" / "report.html").is_file()


def test_the_api_is_the_package_top_level_and_imports_lazily() -> None:
    code = "import sys, reproflow; print(sorted(reproflow.__all__), 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("] ")[1].strip() == "False"  # the command line does not pay for pandas
    assert callable(reproflow.run_suite) and callable(reproflow.read_results)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = reproflow.nothing  # type: ignore[attr-defined]


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ReproflowError, match="no suite named 'no-such-suite'"):
        reproflow.load_suite("no-such-suite")
    with pytest.raises(ReproflowError, match="iters"):
        reproflow.load_suite("smoke", {"iters": "many"})
    with pytest.raises(ReproflowError, match="no experiment 'nope'"):
        reproflow.run_suite("smoke", ["nope"], results=tmp_path)
