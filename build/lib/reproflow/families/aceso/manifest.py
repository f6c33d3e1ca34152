"""A search's outputs on disk: its newest manifest (search-*.json), the Megatron-LM plans measured
(baseline.json), and the config a train point runs."""

from __future__ import annotations

import csv
import json
import re
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


PICKS = ("measured", "predicted", "both")  # which config stands for a plan (resolve_config)


def depth_name(num_stages: int) -> str:
    """A `grid_plan` naming Aceso's config of one pipeline depth (the search writes one per depth)."""
    return f"{num_stages}stages"


def resolve_config(path: Path, plan: str, grid_plan: str = "", pick: str = "measured") -> Path:
    """`path` itself (a .json file), or for a search folder (--config-save-path) one of the configs its
    newest search wrote: `grid_plan` where one is named (plan megatron: a plan of its Megatron-LM grid;
    plan aceso: Aceso's config of that pipeline depth, `depth_name`); else the one that stands for the
    plan: with `pick` predicted, the search's predicted fastest (Aceso's config, or the uniform plan, as
    the artifact picks them); with measured (or both: the two are one config), the fastest measured that
    fits where the screen measured them for that search (baseline.json), else the predicted fastest.
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
    if grid_plan:
        return path / _named(done, manifest, plan, grid_plan)
    name = done.get("megatron") if plan == "megatron" else (done.get("configs") or [None])[0]
    measured = path / BASELINE
    if pick != "predicted" and measured.is_file():
        chosen = json.loads(measured.read_text())
        best = chosen.get("measured_best" if plan == "megatron" else "aceso_measured_best")
        if chosen.get("search") == manifest.name and best:
            name = best
    if not name:
        raise ParamError(f"the search in {manifest} found no {plan} config.", "a search that found one")
    return path / name


def _named(done: dict, manifest: Path, plan: str, grid_plan: str) -> str:
    """The config of the search that `grid_plan` names for `plan`; NotApplicable where the search did not
    write it."""
    if plan == "megatron":
        if grid_plan not in {g["name"] for g in done.get("megatron_grid") or ()}:
            raise NotApplicable(f"{grid_plan} is not among the plans the search in {manifest} wrote to train "
                                "(predicted not to fit its memory limit, or full recomputation where the plan fits "
                                "without it)")
        return grid_plan
    found = [n for n in done.get("configs") or () if f"_{grid_plan}_" in n]
    if not found:
        raise NotApplicable(f"the search in {manifest} found no config of {grid_plan} (none fits its memory limit "
                            "at that pipeline depth)")
    return str(found[0])


def predicted(config: Path) -> tuple[float | None, float | None]:
    """What the newest search of the config's folder predicted for it before any training: iteration
    time (ms) and the heaviest stage's memory (MB); None for what it did not predict (a config of no
    search, or of an older one)."""
    manifest = newest_manifest(config.parent)
    if manifest is None:
        return None, None
    done = json.loads(manifest.read_text())
    grid = {g["name"]: g for g in done.get("megatron_grid") or ()}
    if config.name in grid:
        return grid[config.name].get("predicted_ms"), grid[config.name].get("predicted_mb")
    ms = None
    if config.name in (done.get("configs") or ()):
        depth = re.search(r"_(\d+)stages_", config.name)
        ms = next((d["ms"] for d in done.get("depths") or () if depth and d["num_stages"] == int(depth.group(1))), None)
    elif config.name == done.get("megatron"):
        ms = done.get("megatron_ms")
    info = config.parent / "csv" / f"info_{config.stem}.csv"
    mb = None
    if ms is not None and info.is_file():
        with info.open() as fh:
            mb = max((float(r["memory(total)"]) for r in csv.DictReader(fh)), default=None)
    return ms, mb
