"""`reproflow archive`: one compressed file with everything needed to check or share a reproduction.

It holds the suite files and the reproduction plan (workflows/), the rendered sbatch scripts
(sbatch/), the results (result rows, failure records, environment records, submitit logs), the logs
folder (step logs, Aceso's and CFP's profiles and configs) and the report (page, tables, figures),
led by a MANIFEST.json with each member's size and SHA-256, the commit and reproflow's version.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

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


MANIFEST = "MANIFEST.json"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
    tar.addfile(info, io.BytesIO(data))


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
    with tempfile.TemporaryFile(dir=out.parent) as body:
        # The files go to an uncompressed body first, so that MANIFEST.json, which lists what was packed,
        # can lead the archive: a reader learns the member count and size from its first member.
        with tarfile.open(fileobj=body, mode="w") as tar:
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
                _add(tar, f"{prefix}/{name}", data, mtime)
        manifest = {"reproflow_version": reproflow.__version__, "git_commit": git_commit(str(root)),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files,
                    "left_out": left_out}
        body.seek(0)
        with tarfile.open(partial, "w:gz") as tar, tarfile.open(fileobj=body, mode="r") as packed:
            _add(tar, f"{prefix}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True).encode(), time.time())
            for member in packed:
                tar.addfile(member, packed.extractfile(member))
    partial.replace(out)
    return out, len(files) + 1, left_out


# What an archive to compare may unpack to: a year of nightly runs is ~100,000 point files of a few KiB;
# more is a mistake or a bomb (a million members, or a member claiming terabytes).
MAX_MEMBERS, MAX_BYTES, MAX_MANIFEST = 1_000_000, 64 * 2**30, 256 * 2**20
DIGEST = re.compile(r"[0-9a-f]{64}")


def _not_ours(archive: Path, why: str) -> ReproflowError:
    return ReproflowError(f"{archive}: {why}, so it is not an archive `reproflow archive` wrote (archives written "
                          "before MANIFEST.json led them are refused too). Unpack it yourself (`tar xzf`) and give "
                          "its results folder, or give the results folder itself.")


def _listed(archive: Path, data: bytes) -> dict[str, tuple[int, str]]:
    """MANIFEST.json's files as {name: (bytes, sha256)}, refused unless each is a count and a digest, and
    refused past MAX_MEMBERS files or MAX_BYTES in all before a member is unpacked."""
    try:
        files = json.loads(data)["files"]
        count = len(files)
        listed = {} if count >= MAX_MEMBERS else {name: (entry["bytes"], entry["sha256"])
                                                  for name, entry in files.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise _not_ours(archive, f"its {MANIFEST} does not list files with their bytes and sha256") from None
    for name, (size, digest) in listed.items():
        if type(size) is not int or size < 0 or not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise _not_ours(archive, f"its {MANIFEST} lists {name!r} without a count of bytes and a sha256")
    if count >= MAX_MEMBERS or sum(size for size, _ in listed.values()) > MAX_BYTES:
        raise ReproflowError(f"{archive}: its {MANIFEST} lists more than {MAX_MEMBERS - 1:,} files or "
                             f"{MAX_BYTES / 2**30:g} GiB; it is not one `reproflow archive` wrote for comparing. "
                             "Unpack it yourself and give its results folder.")
    return listed


def unpack_results(archive: Path, into: Path) -> Path:
    """Unpack an archive written by `write_archive` under `into`; returns its results folder.

    The archive's first member must be its MANIFEST.json: the member count and size it lists are checked
    against MAX_MEMBERS and MAX_BYTES before any other member is read, and only the files it lists, with
    the sizes it lists, inside `into`, are unpacked; anything else (a link, a device, a path leading out,
    a file added after) is refused before anything is written, and a file whose SHA-256 is not the one
    listed after. Checked here because Pythons before 3.11.4 (Debian 12's 3.11.2) have no extraction
    filters; where tarfile has them, its "data" filter applies as well.
    """
    root = into.resolve()
    try:
        with tarfile.open(archive) as tar:
            first = tar.next()
            top = PurePosixPath(first.name).parts if first is not None else ()
            if first is None or not first.isfile() or len(top) != 2 or top[1] != MANIFEST:
                raise _not_ours(archive, f"its first member is {first.name if first else None!r}, not "
                                         f"<name>/{MANIFEST}")
            if first.size > MAX_MANIFEST:
                raise _not_ours(archive, f"its {MANIFEST} is {first.size:,} bytes")
            listed = _listed(archive, tar.extractfile(first).read())
            members, unpacked = [], set()
            for member in tar:
                if member is first:
                    continue
                name = member.name.removeprefix(f"{top[0]}/")
                if (not member.isfile() or name == member.name or name not in listed or name in unpacked
                        or member.size != listed[name][0]
                        or not (root / member.name).resolve().is_relative_to(root)):
                    raise ReproflowError(f"{archive}: the archive holds {member.name!r}, which is not a file its "
                                         f"{MANIFEST} lists (a link, a device, a path leading out, a file added "
                                         "or changed after). Give an archive written by `reproflow archive`, or "
                                         "the results folder itself.")
                members.append(member)
                unpacked.add(name)
            tar.extractall(into, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ReproflowError(f"{archive}: not a readable .tar.gz archive ({exc}). Give an archive written by "
                             "`reproflow archive`, or the results folder itself.") from None
    for name in sorted(unpacked):
        with open(into / top[0] / name, "rb") as file:  # unpacked just now, as a regular file inside `into`
            digest = hashlib.file_digest(file, "sha256").hexdigest()
        if digest != listed[name][1]:
            raise ReproflowError(f"{archive}: {top[0]}/{name} is not the file its {MANIFEST} lists (its SHA-256 "
                                 "differs): the archive was changed after it was written. Give the original.")
    found = sorted(into.glob("*/results"))
    if not found:
        raise ReproflowError(f"{archive}: this archive holds no results/ folder. Give an archive written by "
                             "`reproflow archive`, or the results folder itself.")
    return found[0]
