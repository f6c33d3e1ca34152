"""Writing files that readers and concurrent writers may see at any moment (whole files replaced
atomically, lines appended under a lock), and reading a results folder's files as a folder others write
to may hold them: regular files only, links not followed, FIFOs never waited on, a size cap."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reproflow.spec.errors import CONTROL, ReproflowError, text_problem


def umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux's /proc)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


def make_folder(folder: Path, under: Path | None = None) -> None:
    """Create `folder` (and the folders above it). With `under`, every folder from `under` down to it must be
    a folder, not a link: a link planted in a results folder (its runs/ or quarantine/ leading to /etc)
    would send what is written there elsewhere, so it is refused, naming it."""
    if under is None:
        folder.mkdir(parents=True, exist_ok=True)
        return
    under.mkdir(parents=True, exist_ok=True)
    current = under
    for part in folder.relative_to(under).parts:
        current = current / part
        try:
            current.mkdir()
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise ReproflowError(f"{current} is a link or a file, not a folder: reproflow writes below "
                                     f"{under} through its own folders only. Remove it, or give another "
                                     "results folder.") from None


_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+-]|^\.")


def file_stem(name: str) -> str:
    """`name` as a file name within one folder: a character but letters, digits and `_.,=+-` (and a leading
    dot) becomes `_`, so a name made of row values can neither leave the folder nor hide in it; where it
    changed, a hash of the original keeps two names apart."""
    safe = _UNSAFE.sub("_", name)[:120]
    if safe == name:
        return name
    return f"{safe}-{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def atomic_write(path: Path, text: str, *, under: Path | None = None) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never half; with
    `under`, through no link below it (make_folder). The file gets the umask's mode, as any file the user
    creates (a shared folder's group reads it under umask 002), not the private mode of the temporary
    file it is written as. A link at `path` itself is replaced, never written through."""
    make_folder(path.parent, under)
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


def append_line(path: Path, line: str, *, under: Path | None = None) -> None:
    """Append one line under an exclusive lock, so concurrent jobs writing one file lose no line; with
    `under`, through no link below it (make_folder), and never through a link at `path`. Where the file
    system has no flock (Lustre mounted without `-o flock`: ENOSYS), the line goes in one O_APPEND write,
    which local file systems, NFS's single client and Lustre keep whole."""
    make_folder(path.parent, under)
    data = (line.rstrip("\n") + "\n").encode()
    try:  # 0o666 less the umask, as any new file
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReproflowError(f"{path} is a link: reproflow appends to its own files only. Remove it.") from None
        raise
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


@contextlib.contextmanager
def held(path: Path, owner: str, *, under: Path | None = None) -> Iterator[None]:
    """Hold the lock file `path` (flock) while the block runs, `owner` written in it; a ReproflowError
    quoting the holder's line when another process holds it. Where the file system has no flock
    (Lustre without `-o flock`), the block runs unlocked."""
    make_folder(path.parent, under)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    locked = False
    try:
        locked = _take(fd, path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        yield
    finally:
        if locked:  # a later refusal never quotes an ended holder
            os.ftruncate(fd, 0)
        os.close(fd)  # closing releases the lock


def _take(fd: int, path: Path, wait_s: float = 2.0) -> bool:
    """Take the lock on `fd` without waiting on its holder; False where the file system has no flock. A
    holder writes its line just after taking the lock and empties it before releasing, so an empty file
    held by another is a holder starting or ending: the lock is tried again for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            holder = CONTROL.sub(" ", os.pread(fd, 512, 0).decode("utf-8", "replace")).strip()
            if holder or time.monotonic() > deadline:
                raise ReproflowError(f"{path.parent} is being written by {holder or 'another process'}. Wait "
                                     "for it to end, or give another --results folder.") from None
            time.sleep(0.02)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                raise
            return False


# The most a file of a results folder is read to: a point file is some KiB, a year of a job's log some MiB;
# more is a mistake or a planted file (a link to /dev/zero).
MAX_READ = 256 * 2**20


def read_regular(path: Path, limit: int = MAX_READ) -> bytes:
    """The bytes of the regular file at `path`, opened without following a link there and without waiting
    on a FIFO; OSError naming what it is instead (a link, a FIFO, a device, a folder, over `limit` bytes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a link, not a file: not followed", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device, a socket or a folder)", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        parts = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            parts.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(parts)
    finally:
        os.close(fd)


def regular_files(folder: Path, keep: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Every regular file below `folder` whose name `keep` takes, sorted: links (to files or folders) are
    neither followed nor listed, nor are FIFOs, devices, sockets, names starting with a dot, or names that
    are not one line of text (reproflow writes none)."""
    found = []
    for top, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not text_problem(d)
                         and not os.path.islink(os.path.join(top, d)))
        for name in names:
            path = os.path.join(top, name)
            if name.startswith(".") or not keep(name) or text_problem(name):  # reproflow's names are text
                continue
            with contextlib.suppress(OSError):  # gone since listed: not found
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(Path(path))
    return sorted(found)


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
        return json_object(read_regular(path))
    except OSError:
        return None
