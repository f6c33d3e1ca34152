"""Every process a local launch starts, owned by the run that started it, and stopped with it.

mpirun's proxy and every MPI rank it starts call setsid, so neither the run's process group nor its
children list reaches them; and a run killed outright (SIGKILL, a test's time limit) runs no clean-up at
all. So each launch marks its processes with an environment variable no other run carries (launchers pass
the environment on to every rank), finds them by that mark in /proc, and leaves a keeper behind: a small
process in a session of its own that waits on a pipe from the run and, when the pipe closes (the run ended
or died, however), stops whatever still carries the mark. Where /proc is missing (macOS), only the
launcher's own children are stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARK = "REPROFLOW_OWNER"
PROC = Path("/proc")


def marked(mark: str) -> dict[int, dict[str, str]]:
    """The processes (other than this one) whose environment carries `MARK=mark`, each with that
    environment (as it started); zombies left out."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                items = (PROC / entry.name / "environ").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours to read
                continue
            if needle in items:
                pairs = (item.decode(errors="replace").partition("=") for item in items if item)
                found[int(entry.name)] = {k: v for k, _, v in pairs}
    return found


def wchan(pid: int) -> str:
    """The kernel function process `pid` sleeps in ('' when running or unknown): what it waits for."""
    try:
        text = (PROC / str(pid) / "wchan").read_text().strip()
    except OSError:
        return ""
    return "" if text == "0" else text


def stop_marked(mark: str, grace_s: float = 10.0) -> list[int]:
    """SIGTERM to every process carrying `mark`, SIGKILL to those left after `grace_s`, until none is left
    (a process that forks meanwhile is found on the next look). Returns the processes signalled."""
    signalled: dict[int, int] = {}
    kill_at = time.monotonic() + grace_s
    while True:
        pids = marked(mark)
        if not pids:
            return sorted(signalled)
        sig = signal.SIGKILL if time.monotonic() > kill_at else signal.SIGTERM
        for pid in pids:
            if signalled.get(pid) != sig:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                signalled[pid] = sig
        time.sleep(0.05)


class Owned:
    """A launch's processes: `env` marks them; leaving the context stops every one still running, and the
    keeper stops them if this process dies first."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.env = {MARK: self.mark}
        self._keeper: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Owned:
        env = {k: v for k, v in os.environ.items() if k != MARK}
        self._keeper = subprocess.Popen([sys.executable, "-m", "reproflow.launch.owner", self.mark],
                                        stdin=subprocess.PIPE, env=env, start_new_session=True)
        return self

    def processes(self) -> dict[int, dict[str, str]]:
        """The launch's processes running now, each with its environment."""
        return marked(self.mark)

    def __exit__(self, *exc: object) -> None:
        stop_marked(self.mark)
        if self._keeper is not None:
            assert self._keeper.stdin is not None
            self._keeper.stdin.close()
            try:
                self._keeper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._keeper.kill()
                self._keeper.wait()


def _keep(mark: str) -> None:
    """The keeper: wait until the run closes its pipe (it ended, or died), then stop what carries `mark`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a group's SIGTERM is for the ranks, not for their keeper
    sys.stdin.buffer.read()
    stop_marked(mark)


if __name__ == "__main__":
    _keep(sys.argv[1])
