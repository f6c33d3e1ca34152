"""Commands the launcher asks about the machine (Slurm, squash files, MPI): each with a time limit,
and a missing or hung command answered as "nothing", never as an exception."""

from __future__ import annotations

import subprocess


def run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    """The finished command, or None when it is missing or takes over `timeout` seconds."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def output(cmd: list[str]) -> str:
    """What the command printed (stdout, then stderr), or '' when it could not run."""
    proc = run(cmd)
    return proc.stdout + proc.stderr if proc else ""


def run_lines(cmd: list[str]) -> list[str]:
    """A command's output lines; [] when the command is missing, fails or takes over 30 s."""
    proc = run(cmd)
    return proc.stdout.splitlines() if proc and proc.returncode == 0 else []
