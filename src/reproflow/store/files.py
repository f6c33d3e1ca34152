"""Writing files that readers and concurrent writers may see at any moment: whole files replaced
atomically, and lines appended under a lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux's /proc)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never half. The file
    gets the umask's mode, as any file the user creates (a shared folder's group reads it under umask 002),
    not the private mode of the temporary file it is written as."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line under an exclusive lock, so concurrent jobs writing one file lose no line. Where
    the file system has no flock (Lustre mounted without `-o flock`: ENOSYS), the line goes in one
    O_APPEND write, which local file systems, NFS's single client and Lustre keep whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as any new file
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                raise
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """The JSON object in `text`, or None for anything else a damaged or hostile record can be: bytes that
    are not UTF-8, not JSON, nesting past the parser's stack, a list, a string."""
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return found if isinstance(found, dict) else None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file at `path` (see json_object); None where it cannot be read."""
    try:
        return json_object(path.read_bytes())
    except OSError:
        return None
