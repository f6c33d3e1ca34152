"""A search's outputs on disk: its newest manifest (search-*.json), the Megatron-LM plans measured
(baseline.json), and the config a train point runs."""

from __future__ import annotations

import json
from pathlib import Path

from reproflow.spec.errors import NotApplicable, ParamError, ReproflowError
from reproflow.spec.paths import project_root


def newest_file(folder: Path, pattern: str) -> Path | None:
    """The most recently written file of `folder` matching `pattern`, or None."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def newest_manifest(folder: Path) -> Path | None:
    """The newest search manifest (search-*.json) of a --config-save-path, or None."""
    return newest_file(folder, "search-*.json")


BASELINE = "baseline.json"  # the Megatron-LM plans measured, and the fastest (baseline.py)


def resolve_config(path: Path, plan: str, grid_plan: str = "") -> Path:
    """`path` itself (a .json file), or for a search folder (--config-save-path) the config its newest
    search ranked first (`plan` aceso) or its Megatron-LM plan (`plan` megatron): `grid_plan` of its
    grid where one is named, else the fastest measured where the baseline was measured for that search
    (baseline.json), else the search's predicted fastest.
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
    if plan == "megatron" and grid_plan:
        if grid_plan not in {g["name"] for g in done.get("megatron_grid") or ()}:
            raise NotApplicable(f"{grid_plan} is not among the plans the search in {manifest} wrote to train "
                                "(predicted not to fit its memory limit, or full recomputation where the plan fits "
                                "without it)")
        return path / grid_plan
    name = done.get("megatron") if plan == "megatron" else (done.get("configs") or [None])[0]
    measured = path / BASELINE
    if plan == "megatron" and measured.is_file():
        chosen = json.loads(measured.read_text())
        if chosen.get("search") == manifest.name and chosen.get("measured_best"):
            name = chosen["measured_best"]
    if not name:
        raise ParamError(f"the search in {manifest} found no {plan} config.", "a search that found one")
    return path / name
