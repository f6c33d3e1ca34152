"""A search's outputs on disk: its newest manifest (search-*.json), and the config a train point runs."""

from __future__ import annotations

import json
from pathlib import Path

from reproflow.spec.errors import ParamError, ReproflowError
from reproflow.spec.paths import project_root


def newest_file(folder: Path, pattern: str) -> Path | None:
    """The most recently written file of `folder` matching `pattern`, or None."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def newest_manifest(folder: Path) -> Path | None:
    """The newest search manifest (search-*.json) of a --config-save-path, or None."""
    return newest_file(folder, "search-*.json")


def resolve_config(path: Path, plan: str) -> Path:
    """`path` itself (a .json file), or for a search folder (--config-save-path) the config its newest
    search ranked first (`plan` aceso) or that search's Megatron-LM uniform plan (`plan` megatron).
    A relative path that is not under the working directory is looked up in the checkout, as suites
    are (the committed configs of workflows/configs/ from any working directory, or in an image)."""
    if not path.is_absolute() and not path.exists():
        try:
            committed = project_root() / path
        except ReproflowError:
            committed = path
        path = committed if committed.exists() else path
    if path.suffix == ".json":
        return path
    manifest = newest_manifest(path)
    if manifest is None:
        raise ParamError(f"'config' = {str(path)!r} is a folder without a search manifest (search-*.json).",
                         "a config JSON, or the --config-save-path of a finished `reproflow aceso search`")
    done = json.loads(manifest.read_text())
    name = done.get("megatron") if plan == "megatron" else (done.get("configs") or [None])[0]
    if not name:
        raise ParamError(f"the search in {manifest} found no {plan} config.", "a search that found one")
    return path / name
