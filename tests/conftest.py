"""Shared helpers: the checkout root, a tiny-suite writer, and the reproflow command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def write_suite(tmp_path: Path):
    """Write a suite file into tmp_path and return its path."""

    def write(text: str, name: str = "tiny") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


def reproflow(*args: str, cwd: Path = ROOT, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the reproflow CLI as a user would, capturing output."""
    full_env = dict(os.environ) | (env or {})
    return subprocess.run([sys.executable, "-m", "reproflow.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
