"""Running an original tool (param's comms.py, nccl-tests) inside a reproflow job.

Either every rank starts the tool once, as one rank of a new process group rendezvousing at rank 0's
host on a fresh port (param), or rank 0 alone starts it (nccl-tests' single-process binaries). The
ranks then agree on the outcome: a tool that fails anywhere fails the point on every rank
(PointFailed), and the job goes on with the next point.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch.distributed as dist

from reproflow.rank.context import RunContext
from reproflow.rank.ports import free_port
from reproflow.spec.errors import ParamError, PointFailed

T = TypeVar("T")


def param_checkout(script: Path) -> Path:
    """The param checkout in $PARAM_DIR holding `script`, or ParamError saying how to provide it."""
    value = os.environ.get("PARAM_DIR", "")
    if value and (Path(value) / script).is_file():
        return Path(value)
    raise ParamError(f"implementation 'param' needs $PARAM_DIR pointing at a param checkout with {script} "
                     f"(PARAM_DIR={value!r}); the param container sets it.")


def checkout_commit(root: Path, env_var: str) -> str:
    """A tool checkout's commit: $<env_var> (containers carry no .git), else git, else 'unknown'."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass(frozen=True)
class ToolRun:
    """What one rank's tool printed, and the exact command."""

    command: str
    output: str


class ToolOutputError(ValueError):
    """A tool's output that is not a complete result; no rows are taken from it."""


def _rendezvous(ctx: RunContext) -> tuple[str, int]:
    # The tool's rank 0 runs where reproflow's rank 0 runs, so that host and a port free on it.
    box: list[object] = [None]
    if ctx.rank == 0:
        box = [(socket.gethostbyname(socket.gethostname()), free_port())]
    dist.broadcast_object_list(box, src=0)
    addr, port = box[0]  # type: ignore[misc]
    return str(addr), int(port)


def run_group(ctx: RunContext, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
              timeout_s: float = 600.0) -> ToolRun:
    """Run `argv` once per rank as a process group of its own; {MASTER_ADDR} and {MASTER_PORT} in
    `argv` are filled in. Returns this rank's output; raises PointFailed on every rank if any failed."""
    addr, port = _rendezvous(ctx)
    cmd = [a.replace("{MASTER_ADDR}", addr).replace("{MASTER_PORT}", str(port)) for a in argv]
    child_env = dict(os.environ) | dict(env or {})
    child_env.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size), LOCAL_RANK=str(ctx.local_rank),
                     MASTER_ADDR=addr, MASTER_PORT=str(port))
    output, problem = _run(cmd, child_env, cwd, timeout_s)
    detail = ctx.failures(problem)
    if detail:
        raise PointFailed(f"{os.path.basename(cmd[1] if len(cmd) > 1 else cmd[0])} {detail}")
    return ToolRun(" ".join(cmd), output)


def run_on_rank0(ctx: RunContext, argv: Sequence[str], timeout_s: float = 600.0) -> ToolRun:
    """Run `argv` once, on rank 0, while the other ranks wait (a tool that drives every GPU of the node
    itself). Returns its output on rank 0 ('' elsewhere); raises PointFailed on every rank if it failed."""
    output, problem = _run(list(argv), dict(os.environ), None, timeout_s) if ctx.rank == 0 else ("", "")
    detail = ctx.failures(problem)
    if detail:
        raise PointFailed(f"{os.path.basename(argv[0])} {detail}")
    return ToolRun(" ".join(argv), output)


def _run(cmd: list[str], env: dict[str, str], cwd: str | None, timeout_s: float) -> tuple[str, str]:
    """(output, problem) of one run of `cmd`; problem is '' when it exited 0."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "", f"did not finish in {timeout_s:.0f} s"
    except OSError as exc:
        return "", str(exc)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return output, f"exited with {proc.returncode}: " + " | ".join(output.strip().splitlines()[-3:])
    return output, ""


def read_output(ctx: RunContext, parse: Callable[[], T] | None, tool: str) -> T | None:
    """`parse()` on the ranks that read the tool's output (None elsewhere); a ToolOutputError on any
    of them fails the point on every rank."""
    result, problem = None, ""
    if parse is not None:
        try:
            result = parse()
        except ToolOutputError as exc:
            problem = str(exc)
    detail = ctx.failures(problem)
    if detail:
        raise PointFailed(f"{tool} output could not be read: {detail}")
    return result
