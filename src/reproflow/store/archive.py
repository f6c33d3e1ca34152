"""`reproflow archive`: one compressed file with everything needed to check or share a reproduction.

It holds the suite files and the reproduction plan (workflows/), the rendered sbatch scripts
(sbatch/), the results (result rows, failure records, environment records, submitit logs), the logs
folder (step logs, Aceso's and CFP's profiles and configs) and the report (page, tables, figures),
plus a MANIFEST.json with each member's size and SHA-256, the commit and the command that made it.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

import reproflow
from reproflow.spec.errors import ReproflowError
from reproflow.store.files import read_regular, regular_files
from reproflow.store.provenance import git_commit, redact_record
from reproflow.store.results import not_a_results_folder

# The kinds of file reproflow writes into the folders an archive packs (rows, records, logs, suites, scripts,
# report pages and figures); nothing else there is packed (a key, a system file under a folder given).
PACKED = (".csv", ".json", ".jsonl", ".toml", ".log", ".out", ".err", ".txt", ".md", ".html", ".png", ".pdf",
          ".svg", ".sbatch")


def _members(folders: Iterable[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """(file on disk, name in the archive) for every regular file of a kind reproflow writes under the folders
    that exist: links (to files or folders, in or out of them), FIFOs and devices are neither followed nor
    packed."""
    found = []
    for folder, name in folders:
        if folder.is_dir():
            found += [(p, f"{name}/{p.relative_to(folder).as_posix()}")
                      for p in regular_files(folder, lambda n: n.endswith(PACKED))]
    return found


def _is_environment_record(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 4 and parts[0] == "results" and parts[2] == "env" and parts[3].endswith(".json")


def _redacted(data: bytes) -> bytes | None:
    """An environment record redacted again by today's rules (it may come from an older version); None for
    one that cannot be read, which is left out."""
    try:
        return redact_record(data.decode()).encode()
    except (UnicodeDecodeError, ValueError):
        return None


def write_archive(out: Path, root: Path, results: Path, reports: Path, logs: Path) -> tuple[Path, int, dict[str, str]]:
    """Write `out` (.tar.gz) atomically; returns its path, the number of files in it and the files left
    out with why (an environment record that could not be read, so not checked for secrets; a file that
    stopped being a regular one)."""
    prefix = out.name.removesuffix(".tar.gz").removesuffix(".tgz")
    problem = not_a_results_folder(results)
    if problem:
        raise ReproflowError(f"--results: {problem}. Give the folder a run wrote its results into.")
    members = _members([(root / "workflows", "workflows"), (root / "sbatch", "sbatch"),
                              (results, "results"), (logs, "logs"), (reports, "reports")])
    if not any(name.startswith(("results/", "reports/")) for _, name in members):
        raise ReproflowError(f"nothing measured to archive: {results} and {reports} are empty or missing. Run "
                             "`reproflow reproduce` (or a suite and `reproflow report`) first.")
    files: dict[str, dict[str, object]] = {}
    left_out: dict[str, str] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")

    def add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
        info = tarfile.TarInfo(f"{prefix}/{name}")
        info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(partial, "w:gz") as tar:
        for path, name in members:
            try:  # what is packed is what was read and hashed, and only a regular file is read
                data: bytes | None = read_regular(path)
                mtime = path.lstat().st_mtime
            except OSError as exc:
                left_out[name] = f"not packed: {exc.strerror}"
                continue
            if _is_environment_record(name) and (data := _redacted(data)) is None:
                left_out[name] = "not a readable environment record, so it cannot be checked for secrets"
                continue
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            add_bytes(tar, name, data, mtime)
        manifest = {"reproflow_version": reproflow.__version__, "git_commit": git_commit(str(root)),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files,
                    "left_out": left_out}
        add_bytes(tar, "MANIFEST.json", json.dumps(manifest, indent=1, sort_keys=True).encode(), time.time())
    partial.replace(out)
    return out, len(files) + 1, left_out


# What an archive to compare may unpack to: a year of nightly runs is ~100,000 point files of a few KiB;
# more is a mistake or a bomb (a million members, or a member claiming terabytes).
MAX_MEMBERS, MAX_BYTES = 1_000_000, 64 * 2**30


def unpack_results(archive: Path, into: Path) -> Path:
    """Unpack an archive written by `write_archive` under `into`; returns its results folder.

    Only files and folders inside `into` are unpacked; an archive holding anything else (a link, a device,
    a path leading out), more than MAX_MEMBERS members or MAX_BYTES in all is refused before anything is
    written. Checked here because Pythons before 3.11.4 (Debian 12's 3.11.2) have no extraction filters;
    where tarfile has them, its "data" filter applies as well.
    """
    root = into.resolve()
    members, total = [], 0
    try:
        with tarfile.open(archive) as tar:
            for member in tar:  # one by one: the limits stop a bomb before its index is read whole
                total += member.size
                if len(members) == MAX_MEMBERS or total > MAX_BYTES:
                    raise ReproflowError(f"{archive}: the archive holds more than {MAX_MEMBERS:,} members or "
                                         f"{MAX_BYTES / 2**30:g} GiB; it is not one `reproflow archive` wrote. "
                                         "Unpack it yourself and give its results folder.")
                if not (member.isfile() or member.isdir()) or not (root / member.name).resolve().is_relative_to(root):
                    raise ReproflowError(f"{archive}: the archive holds {member.name!r}, which is not a file or a "
                                         "folder inside it (a link, a device, or a path leading out). Give an "
                                         "archive written by `reproflow archive`, or the results folder itself.")
                members.append(member)
            tar.extractall(into, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ReproflowError(f"{archive}: not a readable .tar.gz archive ({exc}). Give an archive written by "
                             "`reproflow archive`, or the results folder itself.") from None
    found = sorted(into.glob("*/results"))
    if not found:
        raise ReproflowError(f"{archive}: this archive holds no results/ folder. Give an archive written by "
                             "`reproflow archive`, or the results folder itself.")
    return found[0]
